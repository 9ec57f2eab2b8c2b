"""Sparse prefill (claims P1-P2): does a block-sparse prefill (MInference's block-sparse
pattern, blocks of B tokens) make retrieval periodic in B, and does vertical-slash not?

Probes: the needle sweep with the prompt prefilled sparsely per pattern (``probes``).
"""

from chunkformer.evaluation.sweep.catalog import Study
from chunkformer.studies.sparse_prefill.probes import sparse_needles

STUDY = Study(
    name="sparse_prefill",
    probes={
        "sparse_needles": sparse_needles.probe,  # needle sweep under sparse prefill patterns
    },
    option_checks={
        "sparse_needles": sparse_needles.check_options,  # the patterns and prompt end
    },
)
