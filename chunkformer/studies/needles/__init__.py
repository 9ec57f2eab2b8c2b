"""The needle study (claims C1-C9): does fixed chunk compression make needle retrieval periodic
in the needle's offset, which ablations keep the period, and which cures remove it?

Its models are read by the engine's instruments (needle sweep, prefix probe, slot gains); it
adds the key-overlap probe, the per-model judgments and seed rule of C1-C9 (``claims``) and the
tables of seeds, split labels, slot nulls, chunk phases and shift maps (``report``).
"""

from chunkformer.evaluation.report.sections import ReportHooks
from chunkformer.evaluation.sweep.catalog import Study
from chunkformer.studies.needles.claims import entries
from chunkformer.studies.needles.probes import key_overlap
from chunkformer.studies.needles.report import claim_tables

STUDY = Study(
    name=entries.STUDY,
    # kv accuracy by the key tokens another needle shares
    probes={"key_overlap": key_overlap.probe},
    claims=entries.CLAIMS,
    judging=entries.JUDGING,
    report=ReportHooks(sections=claim_tables.sections),
)
