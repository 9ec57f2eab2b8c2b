"""Inference-time KV eviction: prune a full-attention model's cache once after the prompt.

  logits, cache = decode.prefill(model, params, prompt_BxT, max_len, eviction=SnapKV(budget=64))

- ``specs.py``: the policies as frozen settings (StreamingLLM, SnapKV, H2O, KNorm, ChunkKV as
  published, its cut-chunk variant ChunkKVCut, ContentChunkKV), budgets as tokens or a share
  of the prompt, ``from_dict`` for configs;
- ``policies.py``: each policy as a pure function of one layer's keys, values and queries;
- ``scores.py``: attention of the prompt's last queries, SnapKV's pooling, key norms;
- ``select.py``: top-k per (row, kv head), whole chunks to a budget;
- ``boundaries.py``: content chunks from the delimiter rule or a trained model's router;
- ``prune.py``: the per-layer selection and the compacted cache (positions kept).
"""

from chunkformer.eviction.chunk_spans import Delimiter, Router
from chunkformer.eviction.specs import (
  H2O,
  POLICIES,
  ChunkKV,
  ChunkKVCut,
  ContentChunkKV,
  KNorm,
  Policy,
  SnapKV,
  StreamingLLM,
  from_dict,
  label,
  short_label,
)

__all__ = ["H2O", "POLICIES", "ChunkKV", "ChunkKVCut", "ContentChunkKV", "Delimiter", "KNorm",
           "Policy", "Router", "SnapKV", "StreamingLLM", "from_dict", "label",
           "short_label"]
