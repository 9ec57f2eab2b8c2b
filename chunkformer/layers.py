"""Building blocks shared by the decoder and every attention kind.

Shape legend (used in names across the package): B batch, T tokens, C compressed entries,
H query heads, K key/value heads, D head dim, M chunk size, W window, E model width,
F MLP width, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def dense_init(fan_in: int):
  return nn.initializers.normal(stddev=fan_in**-0.5)


class RMSNorm(nn.Module):
  """RMS normalisation over the last axis with a learned scale."""

  axis_name: str = "act_embed"  # logical name of the normalised axis
  eps: float = 1e-6

  @nn.compact
  def __call__(self, x: Array) -> Array:
    scale = self.param(
        "scale", nn.with_logical_partitioning(nn.initializers.ones, (self.axis_name,)),
        (x.shape[-1],))
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (y * scale).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class Rope:
  """How one layer rotates: ``dim`` leading channels per head, half-split pairs (Qwen3).

  Pair i rotates channels (i, i + dim/2) at frequency ``base ** (-2i / dim)``. DeepSeek-V4's
  reference rotates the *trailing* ``dim`` channels in *adjacent* pairs (2i, 2i + 1); the two
  layouts are a fixed channel permutation apart (``reference_permutation``), applied to the
  weights by chunkformer/convert/deepseek_v4.py. ``yarn_factor > 1`` with
  ``yarn_original_len > 0`` applies YaRN's frequency interpolation exactly as the reference's
  ``precompute_freqs_cis`` (beta_fast / beta_slow bound the ramp between interpolated and
  kept frequencies); DeepSeek-V4 uses no attention-temperature (mscale) term.
  """

  dim: int  # rotating channels per head (even); 0 = no RoPE
  base: float = 10000.0
  yarn_factor: float = 1.0
  yarn_original_len: int = 0  # context length the base was trained for; 0 = no YaRN
  yarn_beta_fast: float = 32.0
  yarn_beta_slow: float = 1.0

  def inv_freq(self) -> np.ndarray:
    """Angular frequency per pair, float32 [dim // 2] (computed in numpy: a constant)."""
    d = self.dim
    freqs = self.base ** (-np.arange(0, d, 2, dtype=np.float32) / d)
    if self.yarn_original_len > 0 and self.yarn_factor != 1.0:
      def correction_dim(rotations):
        return d * math.log(self.yarn_original_len / (rotations * 2 * math.pi)) / (
            2 * math.log(self.base))
      low = max(math.floor(correction_dim(self.yarn_beta_fast)), 0)
      high = min(math.ceil(correction_dim(self.yarn_beta_slow)), d - 1)
      if low == high:
        high += 0.001
      ramp = np.clip((np.arange(d // 2, dtype=np.float32) - low) / (high - low), 0, 1)
      smooth = 1 - ramp  # 1: high frequency, kept; 0: low frequency, divided by the factor
      freqs = freqs / self.yarn_factor * (1 - smooth) + freqs * smooth
    return freqs.astype(np.float32)


def layer_rope(model, attn) -> Rope:
  """The RoPE of one layer (ModelConfig, AttentionConfig): compressed layers (kinds fixed and
  dynamic) use ``compressed_rope_base`` and YaRN, the others ``rope_base`` without YaRN, as
  DeepSeek-V4's reference (``compress_rope_theta``, ``original_seq_len`` only where
  ``compress_ratio > 0``)."""
  if attn.kind not in ("fixed", "dynamic"):
    return Rope(model.rope_dim, model.rope_base)
  return Rope(model.rope_dim, model.compressed_rope_base or model.rope_base, model.yarn_factor,
              model.yarn_original_len, model.yarn_beta_fast, model.yarn_beta_slow)


def derotates_output(model, attn) -> bool:
  """Whether this layer's attention values are rotated, so its output is rotated back.

  DeepSeek-V4 layout: K = V everywhere, so always. Qwen3 layout: in compressed layers (shared
  KV entries are keys and values), where the raw window values are rotated too, so that every
  value in the one softmax carries RoPE and the inverse rotation of the output is exact.
  ``attn.derotate = False`` restores the earlier behaviour (unrotated raw values, entries'
  rotation left in the output: absolute positions leak into it).
  """
  if not (model.rope_dim and attn.derotate):
    return False
  return attn.layout == "deepseek_v4" or attn.kind in ("fixed", "dynamic")


def reference_permutation(head_dim: int, rope_dim: int) -> np.ndarray:
  """perm with chunkformer channel j = reference channel perm[j] (one head).

  chunkformer: [rope pair reals (i), rope pair imaginaries (i + rd/2), the rest];
  DeepSeek reference: [the rest, rope pairs interleaved (nope + 2i, nope + 2i + 1)].
  """
  nope = head_dim - rope_dim
  pairs = np.arange(rope_dim // 2)
  return np.concatenate([nope + 2 * pairs, nope + 2 * pairs + 1, np.arange(nope)])


def rope_angles(positions: Array, rope: Rope) -> tuple[Array, Array]:
  """cos/sin of shape positions.shape + (rope.dim // 2,)."""
  angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(rope.inv_freq())
  return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x_BxTxNxD: Array, positions_BxT: Array, rope: Rope, inverse: bool = False
               ) -> Array:
  """Rotates the first ``rope.dim`` channels of each head by the angle of its position.

  ``inverse`` rotates back (angle negated): DeepSeek-V4 applies it to the attention output at
  the query's position, so that values carrying RoPE contribute by relative position.
  ``rope.dim == 0`` returns x unchanged, which is how "RoPE off" is expressed.
  """
  if rope.dim == 0:
    return x_BxTxNxD
  cos, sin = rope_angles(positions_BxT, rope)
  cos, sin = cos[:, :, None, :], sin[:, :, None, :]
  if inverse:
    sin = -sin
  rot, rest = x_BxTxNxD[..., :rope.dim], x_BxTxNxD[..., rope.dim:]
  x1, x2 = jnp.split(rot.astype(jnp.float32), 2, axis=-1)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return jnp.concatenate([rotated.astype(x_BxTxNxD.dtype), rest], axis=-1)


def rms_normalize(x: Array, eps: float = 1e-6) -> Array:
  """x / rms(x) over the last axis, no learned scale (DeepSeek-V4's per-head query norm)."""
  x32 = x.astype(jnp.float32)
  return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


def shift_right(x_BxTx_: Array, shift: int, segment_ids_BxT: Array | None = None) -> Array:
  """x_{t-shift} at t (zeros before the row or document start)."""
  if shift == 0:
    return x_BxTx_
  pad = [(0, 0)] * x_BxTx_.ndim
  pad[1] = (shift, 0)
  shifted = jnp.pad(x_BxTx_, pad)[:, : x_BxTx_.shape[1]]
  if segment_ids_BxT is not None:
    same_doc = segment_ids_BxT == jnp.pad(segment_ids_BxT, ((0, 0), (shift, 0)),
                                          constant_values=-1)[:, : segment_ids_BxT.shape[1]]
    shifted = shifted * same_doc.reshape(same_doc.shape + (1,) * (x_BxTx_.ndim - 2))
  return shifted


# Module names a TokenShift takes (keys', values' and queries' shifts); train.shift_frozen_steps
# finds the shift weights by them.
TOKEN_SHIFT_MODULES = ("key_shift", "value_shift", "query_shift")


class TokenShift(nn.Module):
  """Causal local mixing: y_t = sum_{s=1}^{width-1} x_{t-s} W_s (added to keys or values).

  ``width = 2`` is the token shift k_t += W' x_{t-1}; it lets every key carry its predecessor,
  which gives full attention an induction shortcut and moves a needle's key into whatever chunk
  its value lands in. Zero-initialised, so a fresh model starts from the plain layout.
  On queries (``model.query_shift``) it gives the query side the same one-layer view of the
  preceding tokens, so a multi-token key can be matched whole without a previous-token head.
  """

  width: int
  features: tuple[int, int]  # (heads, head_dim) of the output
  names: tuple[str, str] = ("kv_heads", "head_dim")

  @nn.compact
  def __call__(self, x_BxTxE: Array, segment_ids_BxT: Array | None) -> Array:
    out = 0.0
    for s in range(1, self.width):
      w = self.param(
          f"shift_{s}",
          nn.with_logical_partitioning(nn.initializers.zeros, ("embed",) + self.names),
          (x_BxTxE.shape[-1],) + self.features)
      out = out + jnp.einsum("bte,ekd->btkd", shift_right(x_BxTxE, s, segment_ids_BxT),
                             w.astype(x_BxTxE.dtype))
    return out


class Projection(nn.Module):
  """Dense map from the last axis to ``features`` with logical axis names on the kernel."""

  features: tuple[int, ...]
  names: tuple[str, ...]  # logical names of (input axis,) + features axes
  in_axes: int = 1  # how many trailing input axes are contracted

  @nn.compact
  def __call__(self, x: Array) -> Array:
    in_shape = x.shape[-self.in_axes:]
    fan_in = 1
    for n in in_shape:
      fan_in *= n
    kernel = self.param("kernel", nn.with_logical_partitioning(dense_init(fan_in), self.names),
                        tuple(in_shape) + tuple(self.features))
    contract = tuple(range(x.ndim - self.in_axes, x.ndim))
    return jax.lax.dot_general(
        x, kernel.astype(x.dtype), ((contract, tuple(range(self.in_axes))), ((), ())))


class SwiGLU(nn.Module):
  hidden: int

  @nn.compact
  def __call__(self, x_BxTxE: Array) -> Array:
    e = x_BxTxE.shape[-1]
    gate = Projection((self.hidden,), ("embed", "mlp"), name="gate")(x_BxTxE)
    up = Projection((self.hidden,), ("embed", "mlp"), name="up")(x_BxTxE)
    h_BxTxF = nn.with_logical_constraint(nn.silu(gate) * up, ("batch", "length", "mlp"))
    return Projection((e,), ("mlp", "embed"), name="down")(h_BxTxF)
