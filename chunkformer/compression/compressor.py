"""The chunked compressor: hidden states in, compressed entries out (one stream).

Entry j pools the W tokens ending at its chunk's last token, one entry every S tokens
(S = ``attn.chunk_size``, W = ``attn.window_tokens``); offset i in 0..W-1 of the window has
its own gate parameters and payload map where ``attn.offset_maps == "per_offset"``:
s_{j,i} = Z_i h + b_i, alpha_{j,.} = softmax over the W offsets (per channel for the vector
gate, one score per offset for the scalar gate), entry_j = sum_i alpha_{j,i} * C_i h.
Maps are stored as G groups of channels (``pooling.select_groups``): G = 1 shares one map,
G = 2 with W = 2S is DeepSeek-V4's CSA overlap, G = W gives every offset its own.

Parameters (per layer, per stream; shared-KV attention has one stream, separate key/value
compression two):
- ``wkv/kernel`` E x K x (G*D) and ``wgate/kernel`` E x K x (G*g): payload values
  ``kv = x C`` and gate logits ``z = x Z`` (g = D vector gate, 1 scalar gate);
- ``ape`` (W/G) x K x (G*g): the learned per-offset gate bias b_i (``pooling.offset_table``);
- ``slot_embedding`` (W/G) x K x (G*D), ``mlp_in`` K x (W*D) x (W*D), ``mlp_out``
  K x (W*D) x D: the NSA-style MLP pooling (intra-block position embedding added to every
  slot, then a 2-layer ReLU MLP over the flattened block);
- ``payload_norm/scale`` D: optional RMSNorm of each token's payload (post-norm);
- ``norm/scale`` D: RMSNorm of the pooled entry (``normalise``); ``shift_*``: optional token
  shift of kv.

The steps are separate methods so that other chunkings (the packed/dynamic path, decoding)
reuse the same weights: ``project`` -> fill a slot buffer -> ``pool_slots`` -> ``finish``.
``__call__`` runs them for fixed chunks, optionally shifted by per-row, per-head offsets.
Pass ``mutable=["intermediates"]`` to ``apply`` to get the realised pooling weights
(``pool_weights``, B x C x W x K, averaged over channels; with overlap slots 0..S-1 are the
previous chunk).
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

import kernels
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
  """Where fixed chunks of S tokens (boundaries shifted by an offset per row and head) lie.

  Chunk j of kv head k in row b holds row indices ``j*S - o .. (j+1)*S - 1 - o``
  (o = offsets[b, k]); its entry pools the window of W tokens ending at the chunk's last token.
  Slots outside the row, or in another document than the chunk's last token, are padding: a
  window spanning a document boundary becomes an entry of the later document only, and the
  earlier document's tail tokens in it reach no entry (they stay visible through the raw
  window). Chunks not finished inside the row have end >= T. Under "start" alignment an entry
  whose window begins before the row or its document is dropped: its segment id is
  ``kernels.PAD_SEGMENT``, so the one visibility rule never shows it (its end stays in order).
  """

  tok_BxCxMxK: Array  # row index of each slot of the entry's own chunk (may be < 0 or >= T)
  valid_BxCxMxK: Array  # own-chunk slot is a token of the chunk's document
  window_tok_BxCxWxK: Array  # row index of each slot of the entry's window (last S = own chunk)
  window_valid_BxCxWxK: Array  # window slot is a token of the entry's document
  ends_BxCxK: Array  # row index of the chunk's last token
  positions_BxCxK: Array  # RoPE position of the entry: its chunk's start position
  segment_ids_BxCxK: Array | None  # document of the entry (of its last token)
  offsets_BxK: Array | None  # None: all zero (reshape fast path)


def num_fixed_chunks(seq_len: int, chunk_size: int) -> int:
  """Chunks per row: ceil(T/S) covers every finished chunk for any offset in [0, S)."""
  return math.ceil(seq_len / chunk_size)


def fixed_chunks(seq_len: int, chunk_size: int, offsets_BxK: Array | None, batch: int,
                 num_kv_heads: int, positions_BxT: Array | None = None,
                 segment_ids_BxT: Array | None = None, window: int = 0,
                 align: str = "end") -> FixedChunks:
  """The fixed-chunk layout of a row of ``seq_len`` tokens (see FixedChunks).

  ``window`` is W (0 = chunk_size); ``align`` is ``attn.compress_window_align`` (the offsets
  already hold its grid shift). ``positions_BxT`` default to 0..T-1; an entry's RoPE position
  is the position of its last token minus S - 1 (the chunk start j*S - o, which the padded
  first chunk puts below 0), or under "start" alignment minus W - 1 (its window's start).
  """
  t, m = seq_len, chunk_size
  w = window or m
  c = num_fixed_chunks(t, m)
  offsets = (jnp.zeros((batch, num_kv_heads), jnp.int32) if offsets_BxK is None
             else offsets_BxK.astype(jnp.int32))
  tok = pooling.fixed_slot_tokens(c, m, offsets, w)
  ends = tok[:, :, w - 1, :]
  in_row = (tok >= 0) & (tok < t)

  def at_window(x_BxT: Array) -> Array:
    """x at every window slot, x_BxCxWxK (the chunk's last token at slot W - 1)."""
    return pooling.window_slots(jnp.broadcast_to(x_BxT[:, :, None], (batch, t, num_kv_heads)),
                                c, m, w, offsets_BxK)

  seg_end = None
  if segment_ids_BxT is not None:
    seg = at_window(segment_ids_BxT)
    seg_end = seg[:, :, w - 1:]
    in_row &= seg == seg_end
  lag = w - 1 if align == "start" else m - 1
  if positions_BxT is None:
    positions = ends - lag
  else:
    positions = at_window(positions_BxT)[:, :, w - 1] - lag
  if align == "start":  # only windows that lie whole in the row and in their document
    if seg_end is None:  # one document
      seg_end = jnp.zeros_like(ends[:, :, None, :])
    # Slot 0 is the window's first token.
    seg_end = jnp.where(in_row[:, :, :1], seg_end, kernels.PAD_SEGMENT)
  return FixedChunks(tok[:, :, w - m:], in_row[:, :, w - m:], tok, in_row, ends, positions,
                     None if seg_end is None else seg_end[:, :, 0], offsets_BxK)


class Compressor(nn.Module):
  """One compressed stream of one layer: x_BxTxE -> entries_BxCxKxD (see module docstring)."""

  model: ModelConfig
  attn: AttentionConfig
  token_shift: bool = False  # add the model's key token shift (width model.key_shift) to kv
  num_slots: int = 0  # slots of a window (dynamic kind: the longest chunk); 0 = the fixed W
  normalise: bool = True  # RMSNorm of every pooled entry

  @property
  def slots(self) -> int:
    """W: slots of one window."""
    return self.num_slots or self.attn.window_tokens

  @property
  def groups(self) -> int:
    """G: payload/gate maps, each serving W/G consecutive offsets (1 for the dynamic kind)."""
    return 1 if self.num_slots else self.attn.map_groups

  @property
  def width(self) -> int:
    """R: compressor channels per kv head, G maps of D."""
    return self.model.head_dim * self.groups

  @property
  def gate_width(self) -> int:
    """Gate channels per kv head: G maps of D (vector gate) or of 1 (scalar gate)."""
    return (self.model.head_dim if self.attn.gate == "vector" else 1) * self.groups

  @property
  def gated(self) -> bool:
    return self.attn.pooling in ("gated", "gated_no_bias")

  def setup(self):
    m, a = self.model, self.attn
    k, r, rows = m.num_kv_heads, self.width, self.slots // self.groups
    names = ("embed", "kv_heads", "head_dim")
    self.wkv = Projection((k, r), names)
    if self.gated:
      self.wgate = Projection((k, self.gate_width), names)
    if a.pooling == "gated":
      # Zero init: every slot starts with the same gain; any slot preference is learned.
      self.ape = self.param("ape", nn.with_logical_partitioning(
          nn.initializers.zeros, ("slots", "kv_heads", "head_dim")), (rows, k, self.gate_width))
    if a.pooling == "mlp":
      block = self.slots * m.head_dim
      self.slot_embedding = self.param("slot_embedding", nn.with_logical_partitioning(
          nn.initializers.normal(stddev=0.02), ("slots", "kv_heads", "head_dim")), (rows, k, r))
      self.mlp_in = self.param("mlp_in", nn.with_logical_partitioning(
          dense_init(block), ("kv_heads", "head_dim", "mlp")), (k, block, block))
      self.mlp_out = self.param("mlp_out", nn.with_logical_partitioning(
          dense_init(block), ("kv_heads", "mlp", "head_dim")), (k, block, m.head_dim))
    if self.token_shift and m.key_shift:
      self.shift = TokenShift(m.key_shift, (k, r))
    if a.payload_norm:
      self.payload_norm = RMSNorm(axis_name="head_dim")
    if self.normalise:
      self.norm = RMSNorm(axis_name="head_dim")

  def project(self, x_BxTxE: Array, segment_ids_BxT: Array | None = None
              ) -> tuple[Array, Array | None]:
    """kv_BxTxKxR and gate logits z_BxTxKx(G*g) (None for mean and MLP pooling)."""
    kv = self.wkv(x_BxTxE)
    if self.token_shift and self.model.key_shift:
      kv = kv + self.shift(x_BxTxE, segment_ids_BxT)
    z = self.wgate(x_BxTxE) if self.gated else None
    return kv, z

  def slot_bias(self) -> Array | None:
    """ape_WxKxg, the learned per-offset gate bias (None unless pooling == 'gated')."""
    if self.attn.pooling != "gated":
      return None
    return pooling.offset_table(self.ape, self.groups)

  def pool_slots(self, kv_BxCxSxKxR: Array, z_BxCxSxKxR: Array | None,
                 valid_BxCxSxK: Array) -> Array:
    """Pools a slot buffer of S <= W slots into pooled_BxCxKxD (before norm and RoPE).

    Slot s is offset s of the window: its map group's channels, bias and slot embedding.
    """
    a = self.attn
    s = kv_BxCxSxKxR.shape[2]
    if s > self.slots:
      raise ValueError(f"slot buffer has {s} slots, the compressor's tables {self.slots}")
    g = self.groups
    kv = pooling.select_groups(kv_BxCxSxKxR, g)
    if a.payload_norm:
      kv = self.payload_norm(kv)
    if a.pooling == "mean":
      pooled, w_BxCxSxK = pooling.pool_mean(kv, valid_BxCxSxK)
    elif a.pooling == "mlp":
      embedding = pooling.offset_table(self.slot_embedding, g)[:s]
      pooled, w_BxCxSxK = self._mlp(kv + embedding.astype(kv.dtype), valid_BxCxSxK), None
    else:
      scores = pooling.select_groups(z_BxCxSxKxR, g).astype(jnp.float32)
      if a.pooling == "gated":
        scores = scores + self.slot_bias()[:s].astype(jnp.float32)
      pooled, w = pooling.pool_gated(kv, scores, valid_BxCxSxK)
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
    """RMSNorm of each entry (``normalise``), then RoPE on its rope dims at its chunk's start."""
    b, c, k, d = pooled_BxCxKxD.shape
    entries = self.norm(pooled_BxCxKxD) if self.normalise else pooled_BxCxKxD
    rotated = apply_rope(entries.reshape(b, c * k, 1, d), positions_BxCxK.reshape(b, c * k),
                         layer_rope(self.model, self.attn))
    return rotated.reshape(b, c, k, d)

  def slot_buffer(self, x_BxTxK_: Array, chunks: FixedChunks) -> Array:
    """Per-token x laid out as the fixed windows' slot buffer, x_BxCxWxK_."""
    c, w = chunks.window_tok_BxCxWxK.shape[1:3]
    return pooling.window_slots(x_BxTxK_, c, self.attn.chunk_size, w, chunks.offsets_BxK)

  def __call__(self, x_BxTxE: Array, positions_BxT: Array | None = None,
               segment_ids_BxT: Array | None = None, offsets_BxK: Array | None = None
               ) -> tuple[Array, Array]:
    """Entries of fixed chunks: (entries_BxCxKxD, ends_BxCxK), C = ceil(T / S).

    Entry j of head k is visible to query t iff ``ends[j, k] <= t`` (same document); chunks
    not finished inside the row have end >= T, and entries that "start" alignment drops end
    at ``kernels.PAD_END``. ``offsets_BxK`` (in [0, S)) shift boundaries, the alignment's
    shift included (``chunk_offsets``); None = the alignment's shift alone.
    """
    b, t, _ = x_BxTxE.shape
    if offsets_BxK is None and self.attn.align_offset:
      offsets_BxK = jnp.full((b, self.model.num_kv_heads), self.attn.align_offset, jnp.int32)
    chunks = fixed_chunks(t, self.attn.chunk_size, offsets_BxK, b, self.model.num_kv_heads,
                          positions_BxT, segment_ids_BxT, self.slots,
                          self.attn.compress_window_align)
    ends = chunks.ends_BxCxK
    if chunks.segment_ids_BxCxK is not None:
      ends = jnp.where(chunks.segment_ids_BxCxK == kernels.PAD_SEGMENT, kernels.PAD_END, ends)
    return self.compress(x_BxTxE, chunks, segment_ids_BxT), ends

  def compress(self, x_BxTxE: Array, chunks: FixedChunks,
               segment_ids_BxT: Array | None = None) -> Array:
    """entries_BxCxKxD of the given fixed-chunk layout (its window must be this W)."""
    if chunks.window_tok_BxCxWxK.shape[2] != self.slots:
      raise ValueError(f"chunk layout has windows of {chunks.window_tok_BxCxWxK.shape[2]} "
                       f"tokens, the compressor pools {self.slots}")
    kv, z = self.project(x_BxTxE, segment_ids_BxT)
    kv_slots = self.slot_buffer(kv, chunks)
    z_slots = None if z is None else self.slot_buffer(z, chunks)
    pooled = self.pool_slots(kv_slots, z_slots, chunks.window_valid_BxCxWxK)
    return self.finish(pooled, chunks.positions_BxCxK)
