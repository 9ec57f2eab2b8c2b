"""The DeepSeek-V4 compressor: hidden states in, compressed entries out (one stream).

Parameters (per layer, per stream; shared-KV attention has one stream, separate key/value
compression two):
- ``wkv/kernel`` E x K x R and ``wgate/kernel`` E x K x R: compressor values ``kv = x W_kv``
  and gate logits ``z = x W_gate`` (R = c * D, c = 2 with overlap);
- ``ape`` S x K x R: the learned slot bias (slot gain) of the gated pooling;
- ``slot_embedding`` S x K x R, ``mlp_in`` K x (c'S * D) x F', ``mlp_out`` K x F' x D: the NSA-style
  MLP pooling (intra-block position embedding added to every slot, then a 2-layer ReLU MLP over
  the flattened block; F' = c'S * D, c' = 2 with overlap, as the usual NSA reference code);
- ``norm/scale`` D: RMSNorm of the pooled entry; ``shift_*``: optional token shift of kv.

The steps are separate methods so that other chunkings (the packed/dynamic path, decoding)
reuse the same weights: ``project`` -> fill a slot buffer -> ``pool_slots`` -> ``finish``.
``__call__`` runs them for fixed chunks of M tokens, optionally shifted by per-row, per-head
offsets. Pass ``mutable=["intermediates"]`` to ``apply`` to get the realised pooling weights
(``pool_weights``, B x C x S' x K, averaged over channels; S' = 2S with overlap, slots
0..S-1 then being chunk i-1).
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from chunkformer.compression import pooling
from chunkformer.config import AttentionConfig, ModelConfig
from chunkformer.layers import (
  Projection,
  RMSNorm,
  TokenShift,
  apply_rope,
  dense_init,
  layer_rope,
)

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FixedChunks:
  """Where fixed chunks of M tokens (boundaries shifted by an offset per row and head) lie.

  Entry j of kv head k in row b pools row indices ``j*M - o .. (j+1)*M - 1 - o``
  (o = offsets[b, k]). Slots outside the row, or in another document than the chunk's last
  token, are padding: a chunk spanning a document boundary becomes an entry of the later
  document only, and the earlier document's tail tokens in it reach no entry (they stay
  visible through the raw window). Chunks not finished inside the row have end >= T.
  """

  tok_BxCxMxK: Array  # row index of each slot (may be < 0 or >= T: padding)
  valid_BxCxMxK: Array  # slot is a token of the chunk's document
  prev_valid_BxCxMxK: Array  # same for chunk i-1 as seen by entry i (overlap)
  ends_BxCxK: Array  # row index of the chunk's last token
  positions_BxCxK: Array  # RoPE position of the entry: its chunk's start position
  segment_ids_BxCxK: Array | None  # document of the entry (of its last token)
  offsets_BxK: Array | None  # None: all zero (reshape fast path)


def num_fixed_chunks(seq_len: int, chunk_size: int) -> int:
  """Chunks per row: ceil(T/M) covers every finished chunk for any offset in [0, M)."""
  return math.ceil(seq_len / chunk_size)


def fixed_chunks(seq_len: int, chunk_size: int, offsets_BxK: Array | None, batch: int,
                 num_kv_heads: int, positions_BxT: Array | None = None,
                 segment_ids_BxT: Array | None = None) -> FixedChunks:
  """The fixed-chunk layout of a row of ``seq_len`` tokens (see FixedChunks).

  ``positions_BxT`` default to 0..T-1; an entry's RoPE position is the position of its last
  token minus M - 1 (the chunk start i*M - o, which the padded first chunk puts below 0).
  """
  t, m = seq_len, chunk_size
  c = num_fixed_chunks(t, m)
  offsets = (jnp.zeros((batch, num_kv_heads), jnp.int32) if offsets_BxK is None
             else offsets_BxK.astype(jnp.int32))
  tok = pooling.fixed_slot_tokens(c, m, offsets)
  ends = tok[:, :, m - 1, :]
  in_row = (tok >= 0) & (tok < t)
  prev_in_row = tok - m >= 0

  def at_tokens(x_BxT: Array, tok_BxCxMxK: Array) -> Array:
    return pooling.gather_slots(jnp.broadcast_to(x_BxT[:, :, None], (batch, t, num_kv_heads)),
                                tok_BxCxMxK)

  seg_end = None
  if segment_ids_BxT is not None:
    seg_end = at_tokens(segment_ids_BxT, ends[:, :, None, :])
    in_row &= at_tokens(segment_ids_BxT, tok) == seg_end
    prev_in_row &= at_tokens(segment_ids_BxT, tok - m) == seg_end
  if positions_BxT is None:
    positions = ends - (m - 1)
  else:
    positions = at_tokens(positions_BxT, ends[:, :, None, :])[:, :, 0] - (m - 1)
  return FixedChunks(tok, in_row, prev_in_row, ends, positions,
                     None if seg_end is None else seg_end[:, :, 0], offsets_BxK)


class Compressor(nn.Module):
  """One compressed stream of one layer: x_BxTxE -> entries_BxCxKxD (see module docstring)."""

  model: ModelConfig
  attn: AttentionConfig
  token_shift: bool = False  # add the model's key token shift (width model.key_shift) to kv
  num_slots: int = 0  # rows of the slot-bias / slot-embedding tables; 0 = attn.chunk_size

  @property
  def slots(self) -> int:
    return self.num_slots or self.attn.chunk_size

  @property
  def width(self) -> int:
    """R: compressor channels per kv head (2D with overlap)."""
    return self.model.head_dim * (2 if self.attn.overlap else 1)

  def setup(self):
    m, a = self.model, self.attn
    k, r, s = m.num_kv_heads, self.width, self.slots
    names = ("embed", "kv_heads", "head_dim")
    self.wkv = Projection((k, r), names)
    if a.pooling in ("gated", "gated_no_bias"):
      self.wgate = Projection((k, r), names)
    if a.pooling == "gated":
      # Zero init: every slot starts with the same gain; any slot preference is learned.
      self.ape = self.param("ape", nn.with_logical_partitioning(
          nn.initializers.zeros, ("slots", "kv_heads", "head_dim")), (s, k, r))
    if a.pooling == "mlp":
      block = s * (2 if a.overlap else 1) * m.head_dim
      self.slot_embedding = self.param("slot_embedding", nn.with_logical_partitioning(
          nn.initializers.normal(stddev=0.02), ("slots", "kv_heads", "head_dim")), (s, k, r))
      self.mlp_in = self.param("mlp_in", nn.with_logical_partitioning(
          dense_init(block), ("kv_heads", "head_dim", "mlp")), (k, block, block))
      self.mlp_out = self.param("mlp_out", nn.with_logical_partitioning(
          dense_init(block), ("kv_heads", "mlp", "head_dim")), (k, block, m.head_dim))
    if self.token_shift and m.key_shift:
      self.shift = TokenShift(m.key_shift, (k, r))
    self.norm = RMSNorm(axis_name="head_dim")

  def project(self, x_BxTxE: Array, segment_ids_BxT: Array | None = None
              ) -> tuple[Array, Array | None]:
    """kv_BxTxKxR and gate logits z_BxTxKxR (None for mean and MLP pooling)."""
    kv = self.wkv(x_BxTxE)
    if self.token_shift and self.model.key_shift:
      kv = kv + self.shift(x_BxTxE, segment_ids_BxT)
    z = self.wgate(x_BxTxE) if self.attn.pooling in ("gated", "gated_no_bias") else None
    return kv, z

  def slot_bias(self) -> Array | None:
    """ape_SxKxR, the learned slot bias (None unless pooling == 'gated')."""
    return self.ape if self.attn.pooling == "gated" else None

  def pool_slots(self, kv_BxCxSxKxR: Array, z_BxCxSxKxR: Array | None, valid_BxCxSxK: Array,
                 prev_kv: Array | None = None, prev_z: Array | None = None,
                 prev_valid: Array | None = None) -> Array:
    """Pools a slot buffer into pooled_BxCxKxD (before norm and RoPE).

    Slot s uses slot-bias row s. With overlap, entry i also pools chunk i-1: ``prev_*`` give
    chunk i-1's slots explicitly (decoding); by default they are the buffer shifted by one
    chunk, with ``prev_valid`` (default: the shifted validity) masking them.
    """
    a = self.attn
    s = kv_BxCxSxKxR.shape[2]
    if s > self.slots:
      raise ValueError(f"slot buffer has {s} slots, the compressor's tables {self.slots}")
    scores = None
    if a.pooling in ("gated", "gated_no_bias"):
      scores = z_BxCxSxKxR.astype(jnp.float32)
      if a.pooling == "gated":
        scores = scores + self.ape[:s].astype(jnp.float32)
    elif a.pooling == "mlp":
      kv_BxCxSxKxR = kv_BxCxSxKxR + self.slot_embedding[:s].astype(kv_BxCxSxKxR.dtype)
    valid = valid_BxCxSxK
    if a.overlap:
      if prev_kv is None:
        prev_kv = pooling.previous_chunk(kv_BxCxSxKxR, 0)
        prev_scores = None if scores is None else pooling.previous_chunk(scores, 0)
      else:
        if a.pooling == "mlp":
          prev_kv = prev_kv + self.slot_embedding[:s].astype(prev_kv.dtype)
        prev_scores = None
        if scores is not None:
          prev_scores = prev_z.astype(jnp.float32)
          if a.pooling == "gated":
            prev_scores = prev_scores + self.ape[:s].astype(jnp.float32)
      if prev_valid is None:
        prev_valid = pooling.previous_chunk(valid_BxCxSxK, False)
      kv_BxCxSxKxR = pooling.overlap_slots(kv_BxCxSxKxR, prev_kv)
      if scores is not None:
        scores = pooling.overlap_slots(scores, prev_scores)
      valid = jnp.concatenate([prev_valid, valid_BxCxSxK], axis=2)
    if a.pooling == "mean":
      pooled, w_BxCxSxK = pooling.pool_mean(kv_BxCxSxKxR, valid)
    elif a.pooling == "mlp":
      pooled, w_BxCxSxK = self._mlp(kv_BxCxSxKxR, valid), None
    else:
      pooled, w = pooling.pool_gated(kv_BxCxSxKxR, scores, valid)
      w_BxCxSxK = jnp.mean(w, axis=-1)
    if w_BxCxSxK is not None:
      self.sow("intermediates", "pool_weights", w_BxCxSxK)
    return pooled

  def _mlp(self, kv_BxCxSxKxD: Array, valid_BxCxSxK: Array) -> Array:
    b, c, s, k, d = kv_BxCxSxKxD.shape
    x = jnp.where(valid_BxCxSxK[..., None], kv_BxCxSxKxD, 0)
    x = jnp.moveaxis(x, 2, 3).reshape(b, c, k, s * d)
    h = nn.relu(jnp.einsum("bckf,kfg->bckg", x, self.mlp_in[:, :s * d].astype(x.dtype)))
    return jnp.einsum("bckg,kgd->bckd", h, self.mlp_out.astype(x.dtype))

  def finish(self, pooled_BxCxKxD: Array, positions_BxCxK: Array) -> Array:
    """RMSNorm of each entry, then RoPE on its rope dims at its chunk's start position."""
    b, c, k, d = pooled_BxCxKxD.shape
    entries = self.norm(pooled_BxCxKxD)
    rotated = apply_rope(entries.reshape(b, c * k, 1, d), positions_BxCxK.reshape(b, c * k),
                         layer_rope(self.model, self.attn))
    return rotated.reshape(b, c, k, d)

  def slot_buffer(self, x_BxTxK_: Array, chunks: FixedChunks) -> Array:
    """Per-token x laid out as the fixed chunks' slot buffer, x_BxCxMxK_."""
    if chunks.offsets_BxK is None:
      return pooling.reshape_slots(x_BxTxK_, chunks.tok_BxCxMxK.shape[1], self.attn.chunk_size)
    return pooling.gather_slots(x_BxTxK_, chunks.tok_BxCxMxK)

  def __call__(self, x_BxTxE: Array, positions_BxT: Array | None = None,
               segment_ids_BxT: Array | None = None, offsets_BxK: Array | None = None
               ) -> tuple[Array, Array]:
    """Entries of fixed chunks: (entries_BxCxKxD, ends_BxCxK), C = ceil(T / M).

    Entry j of head k is visible to query t iff ``ends[j, k] <= t`` (same document); chunks
    not finished inside the row have end >= T. ``offsets_BxK`` (in [0, M)) shift boundaries.
    """
    b, t, _ = x_BxTxE.shape
    chunks = fixed_chunks(t, self.attn.chunk_size, offsets_BxK, b, self.model.num_kv_heads,
                          positions_BxT, segment_ids_BxT)
    return self.compress(x_BxTxE, chunks, segment_ids_BxT), chunks.ends_BxCxK

  def compress(self, x_BxTxE: Array, chunks: FixedChunks,
               segment_ids_BxT: Array | None = None) -> Array:
    """entries_BxCxKxD of the given fixed-chunk layout."""
    kv, z = self.project(x_BxTxE, segment_ids_BxT)
    kv_slots = self.slot_buffer(kv, chunks)
    z_slots = None if z is None else self.slot_buffer(z, chunks)
    pooled = self.pool_slots(kv_slots, z_slots, chunks.valid_BxCxMxK,
                             prev_valid=chunks.prev_valid_BxCxMxK)
    return self.finish(pooled, chunks.positions_BxCxK)
