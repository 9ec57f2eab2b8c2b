"""The paper's protocol (claims C10-C16, arXiv 2609.36322): position-matched lookup and long
needle tests by residue of the target position, gate concentration, gate cycling and KV-head
knockouts, judged against the paper's published table.

The lookup tests themselves are engine instruments (``evaluation.probes.lookup``: other studies
run them under eviction); this study registers them with its mechanism probes, its claims
(``claims``), the main table, the comparison with the paper and the residue tables
(``report``), and the paper's published numbers (``records.published``).
"""

import functools

from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.claims.registry import Judging
from chunkformer.evaluation.probes import lookup
from chunkformer.evaluation.report.sections import ReportHooks
from chunkformer.evaluation.sweep.catalog import Study
from chunkformer.studies.paper.claims import (
    cure_claims,
    effect_size,
    main_table,
    mechanism_claims,
    paper_claims,
)
from chunkformer.studies.paper.probes import gate_concentration, gate_cycling, head_knockout
from chunkformer.studies.paper.report import (
    mechanism_plots,
    paper_table,
    regime,
    residue_tables,
    shape_tables,
)


def _claim(function):
  """A claim of the paper's protocol, judged from the probes' records of every unit."""
  return lambda e: function(e.records, seed=e.seed, num_permutations=e.num_permutations,
                            flags=e.plan_flags)


def _period(claim_id: str, function):
  """A period claim (C10-C12): under the current claim rules decided by effect size
  (``claims.effect_size``), under version 1 by the plan's lack-of-fit test."""
  by_plan = _claim(function)

  def decide(e):
    if e.rules.period != claim_rules.EFFECT_SIZE:
      return by_plan(e)
    return effect_size.decided(claim_id, paper_claims.STATEMENTS[claim_id], e.records,
                               e.prepared.get(effect_size.STUDY), e.plan_flags)
  return decide


def _c13(e):
  """C13, its full-attention reference gated as the claim rules say: the 20% lookup gate
  (version 1), or the reference row judged flat by effect size (its power gate, versions 2-3);
  one reference for every row, or each row's of its KV heads (version 3)."""
  reference = None
  if e.rules.period == claim_rules.EFFECT_SIZE:
    reference = effect_size.flat_reference(e.prepared.get(effect_size.STUDY))
  return paper_claims.c13(e.records, flags=e.plan_flags, reference_gate=reference,
                          same_kv_heads=e.rules.c13_pairing == claim_rules.SAME_KV_HEADS)


def _cure(claim_id: str):
  """C17-C21: a cure under the paper's protocol (``claims.cure_claims``, plan version 5)."""
  return lambda e: cure_claims.judge(claim_id, e.records, e.prepared.get(effect_size.STUDY),
                                     e.matrices, e.plan_flags)


_VOCABULARY_CHECKED = ("lookup", "long_needle", "gate_cycling", "head_knockout")

_PROBES = {
    "lookup": lookup.probe,  # position-matched lookup: accuracy by residue, Wilson intervals
    "long_needle": lookup.needle_probe,  # multi-token records filling the context
    "gate_concentration": gate_concentration.probe,  # effective offsets per gate
    "gate_cycling": gate_cycling.probe,  # gates cycled by delta: do the weak phases follow?
    "head_knockout": head_knockout.probe,  # KV heads mean-replaced: change by residue
}

STUDY = Study(
    name="paper",
    probes=_PROBES,
    option_checks={name: functools.partial(lookup.check_options, f"sweep.probes.{name}",
                                           _PROBES[name])
                   for name in _VOCABULARY_CHECKED},
    claims={
        "C10": _period("C10", paper_claims.c10),  # lookup period = S for S in 4, 6, 8, 12
        "C11": _period("C11", paper_claims.c11),  # full attention flat on the lookup test
        "C12": _period("C12", paper_claims.c12),  # no RoPE and uniform averaging stay periodic
        "C13": _c13,  # mean accuracy hides the effect
        "C14": _claim(mechanism_claims.c14),  # knockouts: phase-specialised heads, not in full
        "C15": _claim(mechanism_claims.c15),  # concentrated gates line up with knockout phases
        "C16": _claim(mechanism_claims.c16),  # cycling moves the weak phases, boundary stays
        # C17-C21: does a cure remove the period (random phase, stagger, key shift, dynamic
        # chunking, stride 2)?
        **{claim_id: _cure(claim_id) for claim_id in cure_claims.CURES},
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
        regime=regime.lines,
        sections=shape_tables.section,
    ),
)
