"""``attention.implementation: auto``: the implementation each layer runs on this platform.

``resolve`` replaces ``auto`` in a layer's AttentionConfig before the layer is built (the
decoder's Block does it), so every consumer below it (the kinds, their caches, the kernels)
sees a concrete name:
- kind ``full``: on GPU the project's Pallas kernel with a whole-row window (``pallas_gpu``), on
  TPU JAX's splash attention (``splash``), else ``blockwise`` (XLA online softmax, no T x T
  scores);
- kinds ``fixed`` / ``dynamic``: the platform's Pallas kernel where the layer's options allow it
  (no indexer top-k, no uncompressed tail, no per-head stagger over several kv heads), else
  ``xla``; kind ``window``: ``xla``.
"""

from __future__ import annotations

import dataclasses

import jax

from chunkformer.config import AttentionConfig

PALLAS_BY_PLATFORM = {"gpu": "pallas_gpu", "cuda": "pallas_gpu", "tpu": "pallas_tpu"}


def choose(attn: AttentionConfig, num_kv_heads: int, platform: str) -> str:
  """The concrete implementation ``auto`` means for this layer on ``platform``."""
  pallas = PALLAS_BY_PLATFORM.get(platform)
  if attn.kind == "full":
    return {"pallas_gpu": "pallas_gpu", "pallas_tpu": "splash"}.get(pallas, "blockwise")
  kernel_serves = (attn.kind in ("fixed", "dynamic") and attn.topk == 0 and not attn.tail
                   and (attn.stagger != "heads" or num_kv_heads == 1))
  return pallas if pallas and kernel_serves else "xla"


def resolve(attn: AttentionConfig, num_kv_heads: int,
            platform: str | None = None) -> AttentionConfig:
  """``attn`` itself, or with ``auto`` replaced by ``choose`` (platform: JAX's default)."""
  if attn.implementation != "auto":
    return attn
  platform = jax.default_backend() if platform is None else platform
  return dataclasses.replace(attn, implementation=choose(attn, num_kv_heads, platform))
