"""Sparse prefill (claims P1-P2): does a block-sparse prefill (MInference's block-sparse
pattern, blocks of B tokens) make retrieval periodic in B, and does vertical-slash not?

Probes: the needle sweep with the prompt prefilled sparsely per pattern (``probes``); claims
P1-P2 from each pattern's per-phase accuracy (``claims``); the phase tables and grids
(``report``).
"""

from chunkformer.evaluation.claims.registry import Judging
from chunkformer.evaluation.report.sections import ReportHooks
from chunkformer.evaluation.sweep.catalog import Study
from chunkformer.studies.sparse_prefill.claims import sparse_claims, sparse_data
from chunkformer.studies.sparse_prefill.probes import sparse_needles
from chunkformer.studies.sparse_prefill.report import sparse_tables

STUDY = Study(
    name="sparse_prefill",
    probes={
        "sparse_needles": sparse_needles.probe,  # needle sweep under sparse prefill patterns
    },
    option_checks={
        "sparse_needles": sparse_needles.check_options,  # the patterns and prompt end
    },
    claims={
        "P1": sparse_claims.p1_claim,  # block-sparse prefill: period = block size B
        "P2": sparse_claims.p2_claim,  # vertical-slash prefill: no period at the block sizes
    },
    judging=Judging(tables=lambda e: sparse_data.tables(e.records, e.matrices)),
    report=ReportHooks(own_probes=(sparse_data.PROBE,), sections=sparse_tables.report_section),
)
