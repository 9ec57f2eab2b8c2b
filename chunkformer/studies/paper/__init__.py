"""The paper's protocol (claims C10-C16, arXiv 2609.36322): position-matched lookup and long
needle tests by residue of the target position, gate concentration, gate cycling and KV-head
knockouts, judged against the paper's published table.

The lookup tests themselves are engine instruments (``evaluation.probes.lookup``: other studies
run them under eviction); this study registers them with its mechanism probes, its claims
(``claims``), the main table, the comparison with the paper and the residue tables
(``report``), and the paper's published numbers (``records.published``).
"""

import functools

from chunkformer.evaluation.claims.registry import Judging
from chunkformer.evaluation.probes import lookup
from chunkformer.evaluation.report.sections import ReportHooks
from chunkformer.evaluation.sweep.catalog import Study
from chunkformer.studies.paper.claims import (
    effect_size,
    main_table,
    mechanism_claims,
    paper_claims,
)
from chunkformer.studies.paper.probes import gate_concentration, gate_cycling, head_knockout
from chunkformer.studies.paper.report import (
    mechanism_plots,
    paper_table,
    residue_tables,
    shape_tables,
)


def _claim(function):
  """A claim of the paper's protocol, judged from the probes' records of every unit."""
  return lambda e: function(e.records, seed=e.seed, num_permutations=e.num_permutations,
                            flags=e.plan_flags)


def _with_effect_size(function):
  """A period claim (C10-C12) decided by the plan, its verdict under the effect-size rules
  beside (``claims.effect_size``)."""
  decide = _claim(function)
  return lambda e: effect_size.beside(decide(e), e.records, e.prepared.get(effect_size.STUDY))


_VOCABULARY_CHECKED = ("lookup", "long_needle", "gate_cycling", "head_knockout")

STUDY = Study(
    name="paper",
    probes={
        "lookup": lookup.probe,  # position-matched lookup: accuracy by residue, Wilson intervals
        "long_needle": lookup.needle_probe,  # multi-token records filling the context
        "gate_concentration": gate_concentration.probe,  # effective offsets per gate
        "gate_cycling": gate_cycling.probe,  # gates cycled by delta: do the weak phases follow?
        "head_knockout": head_knockout.probe,  # KV heads mean-replaced: change by residue
    },
    option_checks={name: functools.partial(lookup.check_vocabulary, f"sweep.probes.{name}")
                   for name in _VOCABULARY_CHECKED},
    claims={
        "C10": _with_effect_size(paper_claims.c10),  # lookup period = S for S in 4, 6, 8, 12
        "C11": _with_effect_size(paper_claims.c11),  # full attention flat on the lookup test
        "C12": _with_effect_size(paper_claims.c12),  # no RoPE and uniform averaging stay periodic
        "C13": _claim(paper_claims.c13),  # mean accuracy hides the effect
        "C14": _claim(mechanism_claims.c14),  # knockouts: phase-specialised heads, not in full
        "C15": _claim(mechanism_claims.c15),  # concentrated gates line up with knockout phases
        "C16": _claim(mechanism_claims.c16),  # cycling moves the weak phases, boundary stays
    },
    judging=Judging(prepare=effect_size.prepare, tables=main_table.tables),
    report=ReportHooks(
        figures={"concentration_plane": mechanism_plots.plot_concentration_plane,
                 "cycling": mechanism_plots.plot_cycling,
                 "knockout_map": mechanism_plots.plot_knockout_map},
        own_probes=residue_tables.RESIDUE_TESTS,
        probe_sections=residue_tables.probe_section,
        overview=paper_table.overview,
        summary=paper_table.summary,
        sections=shape_tables.section,
    ),
)
