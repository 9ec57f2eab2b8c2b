"""The offline per-head search: which pattern each head of a model reads, from calibration prompts.

MInference's kernel-aware search, in our words: every candidate (a pattern with its budget) is
run on the calibration prompts exactly as the prefill runs it (online estimation from the same
queries and keys), and scored on two numbers per head:
- recall: the share of the head's dense attention mass (every calibration query, softmax over
  its causal keys) that falls inside the candidate's index set;
- work: the key-query pairs the kernels compute for it (whole listed tiles plus the column
  chunks; ``index.tile_fraction``) over the causal pairs of a dense prefill: the cost as the
  kernel pays it, not as the mask counts it.
Each head takes the candidate of highest recall among those whose work is within ``max_work``
(ties: the cheaper one); if none is, the cheapest. MInference fixes the candidates' budgets so
that their kernel times match and takes the best recall; a work ceiling is the same choice
with the budget stated in the units our kernels spend.

The dense attention of the calibration prompts is materialised (B x H x T x T per layer): keep
them to a few thousand tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import kernels
from chunkformer.kvcache import full as full_cache
from chunkformer.model import Transformer, init_cache
from chunkformer.sparse_prefill.index import Index, tile_fraction
from chunkformer.sparse_prefill.patterns import Pattern
from chunkformer.sparse_prefill.plan import BLOCK, Plan

Array = jax.Array


class SearchResult(NamedTuple):
  plan: Plan
  candidates: tuple[Pattern, ...]
  recall_LxHxC: np.ndarray  # NaN on layers that are not full attention
  work_LxHxC: np.ndarray


def prompt_queries_and_keys(model: Transformer, params, prompts_BxT: Array
                            ) -> list[tuple[Array, Array] | None]:
  """Each full layer's (q_BxTxHxD, k_BxTxKxD) of a dense prefill of the prompts (None for the
  other kinds), as the prefill computes them."""
  b, t = prompts_BxT.shape
  positions = jnp.broadcast_to(jnp.arange(t), prompts_BxT.shape)
  _, mutated = jax.jit(model.apply, static_argnames=("decode", "mutable"))(
      {"params": params, "cache": init_cache(model.model, b, t)}, prompts_BxT,
      positions, decode=True, mutable=("cache", full_cache.QUERIES))
  out = []
  for layer, attn in enumerate(model.model.layers):
    if attn.kind != "full":
      out.append(None)
      continue
    q = mutated[full_cache.QUERIES][f"block_{layer}"]["attn"]["q"][0]
    out.append((q, mutated["cache"][f"block_{layer}"]["attn"]["state"]["k"]))
  return out


def dense_probs(q_BxTxHxD: Array, k_BxTxKxD: Array) -> Array:
  """probs_BxHxTxT of causal softmax attention (calibration sizes only)."""
  b, t, h, d = q_BxTxHxD.shape
  k = jnp.repeat(k_BxTxKxD, h // k_BxTxKxD.shape[2], axis=2).astype(jnp.float32)
  logits = jnp.einsum("bthd,bshd->bhts", q_BxTxHxD.astype(jnp.float32), k) * d**-0.5
  return jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((t, t), bool)), logits, -jnp.inf), axis=-1)


def recall(probs_BxHxTxT: Array, index: Index, block: int) -> Array:
  """recall_H: the attention mass inside the index set, averaged over rows and queries."""
  t = probs_BxHxTxT.shape[-1]
  mask = kernels.block_sparse_mask(t, *index, block)
  return jnp.where(mask, probs_BxHxTxT, 0.0).sum(-1).mean(axis=(0, 2))


def choose(recall_HxC: np.ndarray, work_HxC: np.ndarray, max_work: float | None) -> np.ndarray:
  """choice_H: per head the best recall within the work ceiling (ties: less work); the least
  work where no candidate fits."""
  fits = np.ones_like(work_HxC, bool) if max_work is None else work_HxC <= max_work
  # lexicographic: fits first, then recall, then less work
  order = np.lexsort((-work_HxC, recall_HxC, fits), axis=-1)
  best = order[:, -1]
  none_fit = ~fits.any(-1)
  return np.where(none_fit, work_HxC.argmin(-1), best)


def search(model: Transformer, params, prompts_BxT: Array, candidates: Sequence[Pattern], *,
           block: int = BLOCK, max_work: float | None = None, **plan_settings) -> SearchResult:
  """A Plan assigning each query head of every full layer one of ``candidates``, chosen on the
  calibration prompts (module docstring); ``plan_settings`` (implementation, interpret) go to
  the Plan."""
  candidates = tuple(candidates)
  if not candidates or not all(isinstance(c, Pattern) for c in candidates):
    raise ValueError(f"search: give one or more patterns, got {candidates!r}")
  m = model.model
  t = prompts_BxT.shape[1]
  shape = (m.num_layers, m.num_heads, len(candidates))
  recalls, works = np.full(shape, np.nan), np.full(shape, np.nan)
  layers = []
  for layer, qk in enumerate(prompt_queries_and_keys(model, params, prompts_BxT)):
    if qk is None:
      layers.append(None)
      continue
    probs = dense_probs(*qk)
    for c, pattern in enumerate(candidates):
      index = pattern.index(*qk, block)
      recalls[layer, :, c] = np.asarray(recall(probs, index, block))
      works[layer, :, c] = np.asarray(tile_fraction(index, t, block).mean(0))
    chosen = choose(recalls[layer], works[layer], max_work)
    layers.append(tuple(candidates[c] for c in chosen))
  plan = Plan(tuple(layers), block=block, **plan_settings)
  plan.check(m)
  return SearchResult(plan, candidates, recalls, works)


def prefill_indices(model: Transformer, params, prompt_BxT: Array, plan: Plan
                    ) -> list[Index | None]:
  """Each layer's index set in a sparse prefill of the prompt (None where the layer is dense):
  what ``decode.prefill(..., sparse=plan)`` attends over, for tests and measurements."""
  b, t = prompt_BxT.shape
  plan.check(model.model)
  positions = jnp.broadcast_to(jnp.arange(t), prompt_BxT.shape)
  _, mutated = jax.jit(model.apply, static_argnames=("decode", "mutable", "sparse"))(
      {"params": params, "cache": init_cache(model.model, b, t)}, prompt_BxT, positions,
      decode=True, sparse=plan, mutable=("cache", full_cache.SPARSE_INDEX))
  sown = mutated.get(full_cache.SPARSE_INDEX, {})
  return [Index(*sown[f"block_{layer}"]["attn"]["index"][0]) if plan.covers(layer) else None
          for layer in range(model.model.num_layers)]
