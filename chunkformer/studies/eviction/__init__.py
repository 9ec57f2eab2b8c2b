"""KV eviction at inference (claims E1-E6): does evicting fixed blocks (ChunkKV) make retrieval
periodic in the block length, does content-chunked eviction remove that, and how does SnapKV
compare with StreamingLLM at equal budget? E1-E3 on the needle sweep, E4-E6 the same on the
position-matched lookup test.

Probes: the needle sweep and the position-matched tests under eviction policies
(``probes``); claims E1-E3 from the per-phase accuracy of each policy on needles
(``claims.eviction_claims``), E4-E6 on the lookup (``claims.lookup_claims``); the phase
tables and grids of both (``report``).
"""

from chunkformer.evaluation.claims.registry import Judging
from chunkformer.evaluation.report.sections import ReportHooks
from chunkformer.evaluation.sweep.catalog import Study
from chunkformer.studies.eviction.claims import eviction_claims, eviction_data, lookup_claims
from chunkformer.studies.eviction.probes import eviction_lookup, eviction_needles
from chunkformer.studies.eviction.report import eviction_tables

STUDY = Study(
    name="eviction",
    probes={
        "eviction_needles": eviction_needles.probe,  # needle sweep under KV eviction policies
        "eviction_lookup": eviction_lookup.probe,  # lookup / long needle tests under eviction
    },
    option_checks={
        "eviction_needles": eviction_needles.check_options,  # the policies and prompt end
        "eviction_lookup": eviction_lookup.check_options,  # the policies, the test, its options
    },
    claims={
        "E1": eviction_claims.e1_claim,  # fixed-block eviction (ChunkKV): period = block length
        "E2": eviction_claims.e2_claim,  # content-chunked eviction removes it at equal budget
        "E3": eviction_claims.e3_claim,  # SnapKV vs StreamingLLM at equal budget
        "E4": lookup_claims.e4_claim,  # E1 on the lookup: ChunkKV's period L
        "E5": lookup_claims.e5_claim,  # E2 on the lookup: content chunks remove it
        "E6": lookup_claims.e6_claim,  # E3 on the lookup: McNemar per seed, sign flips pooled
    },
    judging=Judging(tables=lambda e: (eviction_data.phase_rows(e.records, e.matrices)
                                      + lookup_claims.phase_rows(e.records, e.matrices))),
    report=ReportHooks(own_probes=(eviction_data.PROBE, lookup_claims.PROBE),
                       sections=eviction_tables.report_section),
)
