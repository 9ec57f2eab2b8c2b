"""Slot gains of the chunk compressors: which phases inside a chunk each head listens to.

Two views per compressed layer, stream (``kv``, or ``k``/``v`` with separate compression) and
kv head, each a distribution over the S' slots of a chunk (S' = M, or 2M with overlap: slots
0..M-1 are then chunk i-1's tokens as seen by entry i):
- ``bias_weight``: the learned slot bias alone, ``softmax_s(ape[s, k, c])`` averaged over the
  channels c (gated pooling only; with overlap, channel c' pools chunk i-1 through the first
  half of the channels and chunk i through the second). A flat row means no preferred slot.
  Dynamic layers: the first ``chunk_size`` rows of their ``max_chunk``-row table, the slots a
  chunk of the target length uses.
- ``realised_weight``: the pooling weights the model actually applies (gate + bias), sown by
  the compressor as ``pool_weights`` (B x C x S' x K, averaged over channels; the dynamic
  kind pools inside ``kernels.segment_pool`` and sows none, so it has no realised view),
  averaged over the complete chunks of held-out rows. Incomplete chunks (at the row start
  with an offset, at the row end, across a document boundary) are left out: their weights
  renormalise over fewer slots.
``gain = S' * weight`` (1.0 = the uniform share), and each head's *preferred phase* is the
weight centre of mass ``sum_s s * w_s`` over its slots: early (small) or late (large) in the
chunk, which shows per-head specialisation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from chunkformer.config import ModelConfig
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.stats.slot_null import preferred_phase

POOL_WEIGHTS = "pool_weights"  # sown by chunkformer.compression.Compressor.pool_slots
SLOT_BIAS = "ape"  # the compressor's slot-bias parameter, S x K x R
_LAYER = re.compile(r"block_(\d+)")


def walk(tree: Any, path: tuple[str, ...] = ()):
  """(path, leaf) pairs of a nested mapping (sown intermediates, params), depth first."""
  if isinstance(tree, Mapping):
    for key, value in tree.items():
      yield from walk(value, path + (str(key),))
  else:
    yield path, tree


def _layer_of(path: tuple[str, ...]) -> int:
  for part in path:
    match = _LAYER.fullmatch(part)
    if match:
      return int(match.group(1))
  return -1


def _site(path: tuple[str, ...]) -> str:
  """'block_0/attn/compressor' for a leaf path ending in the sown or parameter name."""
  return "/".join(path[:-1])


def _stream(site: str) -> str:
  last = site.rsplit("/", 1)[-1]
  return {"key_compressor": "k", "value_compressor": "v"}.get(last, "kv")


def extract(intermediates: Any) -> dict[str, jax.Array]:
  """Per row (runs in jit): summed pooling weights of complete chunks and their counts.

  Returns ``{"pool_sum/<site>": [B, S', K], "pool_count/<site>": [B, K]}`` per sown site.
  """
  out = {}
  for path, value in walk(intermediates):
    if POOL_WEIGHTS not in path:
      continue
    site = "/".join(path[:path.index(POOL_WEIGHTS)])
    values = value if isinstance(value, (tuple, list)) else (value,)
    for i, w in enumerate(values):
      name = site if len(values) == 1 else f"{site}#{i}"
      w_BxCxSxK = w.astype(jnp.float32)
      complete_BxCx1xK = jnp.all(w_BxCxSxK > 0, axis=2, keepdims=True)
      out[f"pool_sum/{name}"] = jnp.sum(jnp.where(complete_BxCx1xK, w_BxCxSxK, 0.0), axis=1)
      out[f"pool_count/{name}"] = jnp.sum(complete_BxCx1xK[:, :, 0], axis=1).astype(jnp.float32)
  return out


def bias_weights(ape_SxKxR: np.ndarray, overlap: bool) -> np.ndarray:
  """The slot bias as pooling weights per kv head, [K, S'] (module docstring)."""
  ape = np.asarray(ape_SxKxR, np.float64)
  if overlap:
    half = ape.shape[-1] // 2
    ape = np.concatenate([ape[..., :half], ape[..., half:]], axis=0)  # [2S, K, R/2]
  z = ape - ape.max(axis=0, keepdims=True)
  w = np.exp(z) / np.exp(z).sum(axis=0, keepdims=True)
  return w.mean(axis=-1).T


def _rows(x_KxS: np.ndarray | None) -> list | None:
  if x_KxS is None:
    return None
  return [[None if not np.isfinite(v) else float(v) for v in row] for row in np.atleast_2d(x_KxS)]


def analyze(params: Any, model: ModelConfig, sums: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """Slot gains of every compressor site from params and summed ``extract`` outputs.

  Args:
    params: the model parameters (slot biases are read from ``.../<compressor>/ape``).
    model: the model config (chunk size and overlap of each layer).
    sums: ``extract`` outputs summed over all rows (``pool_sum/...`` [S', K],
      ``pool_count/...`` [K]).
  Returns:
    ``{"sites": [...]}``, one JSON-ready record per site in layer order: layer, stream,
    chunk_size, slots, overlap, pooling, num_chunks, bias_weight / realised_weight (K x S'
    or None), bias_gain / realised_gain (weights times S'), bias_preferred_phase /
    preferred_phase (per head), and ``preferred_phase_spread`` (max - min over heads of the
    realised preferred phase).
  """
  sites: dict[str, dict[str, Any]] = {}
  for path, value in walk(jax.device_get(params)):
    if path and path[-1] == SLOT_BIAS:
      sites.setdefault(_site(path), {})["ape"] = np.asarray(value)
  for key, value in sums.items():
    kind, _, site = key.partition("/")
    if kind in ("pool_sum", "pool_count"):
      sites.setdefault(site, {})[kind] = np.asarray(value, np.float64)
  records = []
  for site in sorted(sites, key=lambda s: (_layer_of(tuple(s.split("/"))), s)):
    found = sites[site]
    layer = _layer_of(tuple(site.split("/")))
    attn = model.layer_attention(layer) if 0 <= layer < model.num_layers else None
    overlap = bool(attn.overlap) if attn is not None else False
    ape = found.get("ape")
    if ape is not None and attn is not None and attn.kind == "dynamic":
      ape = ape[:attn.chunk_size]  # the table has max_chunk rows; a target-length chunk uses these
    bias = bias_weights(ape, overlap) if ape is not None else None
    realised, count = None, 0.0
    if "pool_sum" in found and np.all(found.get("pool_count", 0) > 0):
      realised = (found["pool_sum"] / found["pool_count"][None, :]).T  # [K, S']
      count = float(found["pool_count"].min())
    slots = (realised if realised is not None else bias).shape[-1] if (
        realised is not None or bias is not None) else 0
    preferred = preferred_phase(realised) if realised is not None else None
    records.append({
        "site": site, "layer": layer, "stream": _stream(site),
        "chunk_size": None if attn is None else attn.chunk_size, "slots": slots,
        "overlap": overlap, "pooling": None if attn is None else attn.pooling,
        "num_chunks": count,
        "bias_weight": _rows(bias), "bias_gain": _rows(None if bias is None else bias * slots),
        "bias_preferred_phase": None if bias is None else _rows(preferred_phase(bias))[0],
        "realised_weight": _rows(realised),
        "realised_gain": _rows(None if realised is None else realised * slots),
        "preferred_phase": None if preferred is None else _rows(preferred)[0],
        "preferred_phase_spread": (None if preferred is None or not np.all(np.isfinite(preferred))
                                   else float(np.ptp(preferred))),
    })
  return {"sites": records}


def gain_grids(record: Mapping[str, Any], key: str = "realised_gain") -> dict[int, np.ndarray]:
  """Per slot count S': the [L, K, S'] stack of ``key`` over the sites that have it."""
  grids: dict[int, list] = {}
  for site in record.get("sites", []):
    if site.get(key) is not None:
      grids.setdefault(site["slots"], []).append(np.asarray(site[key], np.float64))
  return {slots: np.stack(rows) for slots, rows in grids.items()}


def init_params(trained: trained_lib.TrainedModel) -> Any:
  """The step-0 parameters of the trained run's config (``Runtime.init_state``, same seed):
  their slot gains on the same rows are C6's null at initialisation."""
  return trained.runtime.init_state().params
