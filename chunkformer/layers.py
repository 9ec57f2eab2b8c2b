"""Building blocks shared by the decoder and every attention kind.

Shape legend (used in names across the package): B batch, T tokens, C compressed entries,
H query heads, K key/value heads, D head dim, M chunk size, W window, E model width,
F MLP width, V vocabulary.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

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


def rope_angles(positions: Array, rope_dim: int, base: float) -> tuple[Array, Array]:
  """cos/sin of shape positions.shape + (rope_dim // 2,)."""
  inv_freq = base ** (-jnp.arange(0, rope_dim, 2, dtype=jnp.float32) / rope_dim)
  angles = positions.astype(jnp.float32)[..., None] * inv_freq
  return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x_BxTxNxD: Array, positions_BxT: Array, rope_dim: int, base: float) -> Array:
  """Rotates the first ``rope_dim`` channels of each head (half-split layout, as Qwen3).

  ``rope_dim == 0`` returns x unchanged, which is how "RoPE off" is expressed.
  """
  if rope_dim == 0:
    return x_BxTxNxD
  cos, sin = rope_angles(positions_BxT, rope_dim, base)
  cos, sin = cos[:, :, None, :], sin[:, :, None, :]
  rot, rest = x_BxTxNxD[..., :rope_dim], x_BxTxNxD[..., rope_dim:]
  x1, x2 = jnp.split(rot.astype(jnp.float32), 2, axis=-1)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return jnp.concatenate([rotated.astype(x_BxTxNxD.dtype), rest], axis=-1)


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


class TokenShift(nn.Module):
  """Causal local mixing: y_t = sum_{s=1}^{width-1} x_{t-s} W_s (added to keys or values).

  ``width = 2`` is the token shift k_t += W' x_{t-1}; it lets every key carry its predecessor,
  which gives full attention an induction shortcut and moves a needle's key into whatever chunk
  its value lands in. Zero-initialised, so a fresh model starts from the plain layout.
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
