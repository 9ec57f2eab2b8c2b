"""DeepSeek-V4 attention weights (the reference's names and layout) -> chunkformer parameters.

``attention_params(weights, model, attn)`` maps one attention layer, given as a dict of numpy
arrays under the reference's names (``layers.N.attn.`` prefix removed; torch ``Linear`` weights
are out x in), into the parameter tree of chunkformer's ``fixed`` / ``window`` kind with
``attn.layout = "deepseek_v4"`` and one kv head (the reference is MQA):

  reference                        chunkformer (shape)
  wq_a.weight      Rq x E           qkv/wq_a/kernel        E x Rq
  q_norm.weight    Rq               qkv/q_norm/scale       Rq
  wq_b.weight      H*D x Rq         qkv/wq_b/kernel        Rq x H x D        (P on D)
  wkv.weight       D x E            qkv/wkv/kernel         E x 1 x D         (P)
  kv_norm.weight   D                qkv/kv_norm/scale      D                 (P)
  wo_a.weight      G*R x H*D/G      out/wo_a               G x H/G x D x R   (P on D)
  wo_b.weight      E x G*R          out/wo_b               G x R x E
  attn_sink        H                sink                   H
  compressor.wkv.weight    c*D x E  compressor/wkv/kernel  E x 1 x c*D       (P per half)
  compressor.wgate.weight  c*D x E  compressor/wgate/kernel E x 1 x c*D      (P per half)
  compressor.ape           M x c*D  compressor/ape         M x 1 x c*D       (P per half)
  compressor.norm.weight   D        compressor/norm/scale  D                 (P)
  indexer.wq_b.weight      I*Di x Rq          indexer/wq_b/kernel  Rq x I x Di  (P_i on Di)
  indexer.weights_proj.weight  I x E          indexer/weights_proj/kernel  E x I
  indexer.compressor.*     as compressor.* at width Di  indexer/compressor/*     (P_i)

P is the RoPE channel permutation (``layers.reference_permutation``): the reference rotates the
trailing ``rope_dim`` channels in adjacent pairs, chunkformer the leading ones in half-split
pairs; P reorders every per-head channel axis so that both compute the same function (dot
products and RMS norms are invariant under a common permutation). c = 2 with overlap (CSA):
the first D channels feed the previous chunk's slots, the last D the current chunk's, in both.
The reference's FP8/FP4 scales (``*.scale``) are not accepted: dequantise before converting.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from chunkformer.config import AttentionConfig, ModelConfig
from chunkformer.layers import reference_permutation


def _take(weights: Mapping[str, np.ndarray], name: str, shape: tuple[int, ...]) -> np.ndarray:
  if name not in weights:
    raise KeyError(f"DeepSeek-V4 attention weights: missing {name!r} (expected shape {shape})")
  w = np.asarray(weights[name], np.float32)
  if w.shape != shape:
    raise ValueError(f"DeepSeek-V4 attention weight {name!r}: shape {w.shape}, expected {shape} "
                     "for the given model/attention config")
  return w


def _compressor(weights, prefix: str, e: int, d: int, c: int, m: int, perm) -> dict:
  """A compressor's tensors (c*D channels, c halves each permuted by ``perm``)."""
  def halves(w_NxCD):  # ... x c*D -> ... x 1 x c*D with each half permuted
    w = w_NxCD.reshape(w_NxCD.shape[:-1] + (c, d))[..., perm]
    return w.reshape(w_NxCD.shape[:-1] + (1, c * d))

  return {
      "wkv": {"kernel": halves(_take(weights, prefix + "wkv.weight", (c * d, e)).T)},
      "wgate": {"kernel": halves(_take(weights, prefix + "wgate.weight", (c * d, e)).T)},
      "ape": halves(_take(weights, prefix + "ape", (m, c * d))),
      "norm": {"scale": _take(weights, prefix + "norm.weight", (d,))[perm]},
  }


def attention_params(weights: Mapping[str, np.ndarray], model: ModelConfig,
                     attn: AttentionConfig) -> dict:
  """The chunkformer parameter tree of one attention layer (see module docstring).

  Raises a one-line error naming the tensor on a missing, unexpected or mis-shaped weight.
  """
  if attn.layout != "deepseek_v4" or model.num_kv_heads != 1:
    raise ValueError("DeepSeek-V4 weights need attn.layout='deepseek_v4' and "
                     f"model.num_kv_heads=1, got {attn.layout!r} and {model.num_kv_heads}")
  if attn.kind not in ("window", "fixed") or attn.pooling != "gated" or not attn.sink:
    raise ValueError("DeepSeek-V4 layers are kind 'window' or 'fixed' with pooling='gated' and "
                     f"sink=True, got kind={attn.kind!r} pooling={attn.pooling!r} "
                     f"sink={attn.sink}")
  e, h, d, rd = model.d_model, model.num_heads, model.head_dim, model.rope_dim
  rq, g, r = attn.query_rank, attn.output_groups, attn.output_rank
  perm = reference_permutation(d, rd)
  params = {
      "qkv": {
          "wq_a": {"kernel": _take(weights, "wq_a.weight", (rq, e)).T},
          "q_norm": {"scale": _take(weights, "q_norm.weight", (rq,))},
          "wq_b": {"kernel": _take(weights, "wq_b.weight", (h * d, rq)).T.reshape(
              rq, h, d)[..., perm]},
          "wkv": {"kernel": _take(weights, "wkv.weight", (d, e)).T[:, None, perm]},
          "kv_norm": {"scale": _take(weights, "kv_norm.weight", (d,))[perm]},
      },
      "out": {
          "wo_a": _take(weights, "wo_a.weight", (g * r, h * d // g)).reshape(
              g, r, h // g, d)[..., perm].transpose(0, 2, 3, 1),
          "wo_b": _take(weights, "wo_b.weight", (e, g * r)).T.reshape(g, r, e),
      },
      "sink": _take(weights, "attn_sink", (h,)),
  }
  expected = {"wq_a.weight", "q_norm.weight", "wq_b.weight", "wkv.weight", "kv_norm.weight",
              "wo_a.weight", "wo_b.weight", "attn_sink"}
  if attn.kind == "fixed":
    c, m = (2 if attn.overlap else 1), attn.chunk_size
    params["compressor"] = _compressor(weights, "compressor.", e, d, c, m, perm)
    expected |= {f"compressor.{n}" for n in ("wkv.weight", "wgate.weight", "ape", "norm.weight")}
    if attn.topk and attn.indexer == "lightning":
      ni, di = attn.index_heads, attn.index_head_dim
      perm_i = reference_permutation(di, rd)
      params["indexer"] = {
          "wq_b": {"kernel": _take(weights, "indexer.wq_b.weight", (ni * di, rq)).T.reshape(
              rq, ni, di)[..., perm_i]},
          "weights_proj": {"kernel": _take(weights, "indexer.weights_proj.weight", (ni, e)).T},
          "compressor": _compressor(weights, "indexer.compressor.", e, di, c, m, perm_i),
      }
      expected |= {"indexer.wq_b.weight", "indexer.weights_proj.weight"} | {
          f"indexer.compressor.{n}" for n in ("wkv.weight", "wgate.weight", "ape", "norm.weight")}
  unexpected = sorted(set(weights) - expected)
  if unexpected:
    raise ValueError(f"DeepSeek-V4 attention weights: unexpected {unexpected} for this config "
                     "(FP8/FP4 '.scale' tensors: dequantise first; 'indexer.*' needs "
                     "kind='fixed', topk > 0, indexer='lightning')")
  return params
