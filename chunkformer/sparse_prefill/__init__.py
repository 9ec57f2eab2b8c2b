"""Sparse prefill for long prompts: MInference-style per-head patterns.

  logits, cache = decode.prefill(model, params, prompt_BxT, max_len, sparse=BlockSparse(top=64))

- ``patterns.py``: the patterns as frozen settings (KeepAll, AShape, VerticalSlash,
  BlockSparse), ``from_dict`` for configs;
- ``estimate.py``: online index estimation from the prompt's last queries / block means;
- ``index.py``: the index set (key blocks + columns per query block), merging heads, the
  useful-FLOP and kernel-work fractions;
- ``plan.py``: a pattern per query head of every full layer (``Plan``), its attention through
  ``kernels.block_sparse_attention``;
- ``search.py``: the offline per-head search on calibration prompts (import it as
  ``chunkformer.sparse_prefill.search``: it runs the model, which the patterns do not need).
Nothing here imports ``chunkformer.decode``, which imports this package (tests/test_imports.py).
Settings against MInference's published defaults: docs/sparse_prefill.md.
"""

from chunkformer.sparse_prefill.index import Index, kept_fraction, tile_fraction
from chunkformer.sparse_prefill.patterns import (
  PATTERNS,
  AShape,
  BlockSparse,
  KeepAll,
  Pattern,
  VerticalSlash,
  from_dict,
)
from chunkformer.sparse_prefill.plan import BLOCK, Plan, resolve

__all__ = ["BLOCK", "PATTERNS", "AShape", "BlockSparse", "Index", "KeepAll", "Pattern", "Plan",
           "VerticalSlash", "from_dict", "kept_fraction", "resolve", "tile_fraction"]
