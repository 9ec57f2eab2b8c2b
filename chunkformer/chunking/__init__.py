"""Dynamic chunking: causal end flags, boundary predictors, the ratio loss and packed layouts.

A chunking is described by end flags ``ends_BxT`` ("a chunk closes at t"); fixed chunking is
``end_flags.fixed_end_flags``, the learned router (``router``) and the delimiter rule
(``delimiter``) propose closes that ``end_flags.enforce_lengths`` turns into end flags under
min/max chunk lengths. ``packing`` maps end flags to the static-capacity packed entry buffers
read by ``kernels.segment_pool`` and ``kernels.chunk_attention``. ``boundaries`` owns a dynamic
layer's chunking: ``boundaries.compute`` returns one typed ``Boundaries`` value (end flags,
router probabilities, packed layout with each entry's visible-from position) that the
attention kind, decoding, the ratio loss and evaluation consume.
"""

from chunkformer.chunking.boundaries import Boundaries
from chunkformer.chunking.delimiter import delimiter_proposals
from chunkformer.chunking.end_flags import (
    enforce_lengths,
    fixed_end_flags,
    is_document_start,
    shortest_chunk,
)
from chunkformer.chunking.packing import (
    PackedLayout,
    entry_capacity,
    pack,
    packed_layout,
    unpack,
)
from chunkformer.chunking.ratio_loss import decided_probs, mean_chunk_length, ratio_loss
from chunkformer.chunking.router import BoundaryRouter, hard_proposals, straight_through

__all__ = [
    "Boundaries",
    "BoundaryRouter",
    "PackedLayout",
    "decided_probs",
    "delimiter_proposals",
    "enforce_lengths",
    "entry_capacity",
    "fixed_end_flags",
    "hard_proposals",
    "is_document_start",
    "mean_chunk_length",
    "pack",
    "packed_layout",
    "ratio_loss",
    "shortest_chunk",
    "straight_through",
    "unpack",
]
