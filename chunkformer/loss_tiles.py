"""Cross-entropy over tiles of tokens: per-token loss and correctness without B x T x V logits.

``cross_entropy(x_BxTxE, w_VxE, targets_BxT, tile=...)`` equals computing the head's logits
``(x @ w.T) * scale`` (float32) and then ``optax.softmax_cross_entropy_with_integer_labels``
and ``argmax == target``, but walks the sequence in tiles of ``tile`` tokens: the forward pass
keeps one tile's B x tile x V logits at a time and saves only the per-token log-sum-exp; a
custom VJP recomputes each tile's logits in the backward pass, returning dx per tile and summing
dw over tiles in float32. Peak loss memory is then a few B x tile x V float32 tiles (plus dw,
the size of the head's gradient anyway) instead of B x T x V logits and their gradient.

``model.loss_token_tile`` chooses it: 0 = the plain head (full logits), n > 0 = tiles of n
tokens, -1 (auto) = tiles of ``AUTO_TILE`` tokens when one row's float32 logits would reach
``AUTO_MIN_LOGITS`` values (vocab_size x T >= 2**27, 512 MiB), else the plain head.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

Array = jax.Array
_F32 = jnp.float32
AUTO_TILE = 512
AUTO_MIN_LOGITS = 2**27


def token_tile(loss_token_tile: int, vocab_size: int, seq_len: int) -> int:
  """Tokens per tile for a row of ``seq_len`` tokens; 0 = the plain (untiled) head."""
  if loss_token_tile >= 0:
    return min(loss_token_tile, seq_len)
  return min(AUTO_TILE, seq_len) if vocab_size * seq_len >= AUTO_MIN_LOGITS else 0


def _tiles(x_BxTx_: Array, tile: int) -> Array:
  """[B, T, ...] -> [n, B, tile, ...], T padded with zeros to n * tile."""
  b, t = x_BxTx_.shape[:2]
  n = -(-t // tile)
  x = jnp.pad(x_BxTx_, ((0, 0), (0, n * tile - t)) + ((0, 0),) * (x_BxTx_.ndim - 2))
  return jnp.moveaxis(x.reshape(b, n, tile, *x_BxTx_.shape[2:]), 1, 0)


def _untile(x_NxBxL_: Array, t: int) -> Array:
  n, b, tile = x_NxBxL_.shape[:3]
  return jnp.moveaxis(x_NxBxL_, 0, 1).reshape(b, n * tile, *x_NxBxL_.shape[3:])[:, :t]


def _logits(x_BxLxE, w_VxE, scale, rounding):
  """One tile of the head's float32 logits, computed as the model's head computes them."""
  if rounding is not None:  # untied Dense: operands and result in model.dtype
    x_BxLxE = x_BxLxE.astype(rounding)
  logits = jnp.einsum("ble,ve->blv", x_BxLxE, w_VxE, preferred_element_type=_F32)
  if rounding is not None:
    logits = logits.astype(rounding).astype(_F32)
  return logits * scale if scale != 1.0 else logits


def _forward(x, w, targets, tile, scale, rounding):
  def one_tile(args):
    x_t, y_t = args
    logits = _logits(x_t, w, scale, rounding)
    lse = jax.nn.logsumexp(logits, axis=-1)
    label = jnp.take_along_axis(logits, y_t[..., None], axis=-1)[..., 0]
    correct = (jnp.argmax(logits, axis=-1) == y_t).astype(_F32)
    return lse - label, correct, lse

  ce, correct, lse = jax.lax.map(one_tile, (_tiles(x, tile), _tiles(targets, tile)))
  t = x.shape[1]
  return _untile(ce, t), _untile(correct, t), _untile(lse, t)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _cross_entropy(x, w, targets, tile, scale, rounding):
  ce, correct, _ = _forward(x, w, targets, tile, scale, rounding)
  return ce, correct


def _cross_entropy_fwd(x, w, targets, tile, scale, rounding):
  ce, correct, lse = _forward(x, w, targets, tile, scale, rounding)
  return (ce, correct), (x, w, targets, lse)


def _cross_entropy_bwd(tile, scale, rounding, residuals, cotangents):
  x, w, targets, lse = residuals
  g_ce, _ = cotangents  # correctness is a step function: no gradient
  v = w.shape[0]

  def one_tile(dw, args):
    x_t, y_t, lse_t, g_t = args
    p = jnp.exp(_logits(x_t, w, scale, rounding) - lse_t[..., None])
    # d ce / d logits = softmax - onehot(target), times the incoming cotangent and the scale.
    dlogits = (p - jax.nn.one_hot(y_t, v, dtype=_F32)) * (g_t * scale)[..., None]
    dx = jnp.einsum("blv,ve->ble", dlogits, w, preferred_element_type=_F32)
    x_f = x_t.astype(rounding) if rounding is not None else x_t
    dw = dw + jnp.einsum("blv,ble->ve", dlogits, x_f, preferred_element_type=_F32)
    return dw, dx.astype(x.dtype)

  args = (_tiles(x, tile), _tiles(targets, tile), _tiles(lse, tile), _tiles(g_ce, tile))
  dw, dx = jax.lax.scan(one_tile, jnp.zeros(w.shape, _F32), args)
  return _untile(dx, x.shape[1]), dw.astype(w.dtype), None


_cross_entropy.defvjp(_cross_entropy_fwd, _cross_entropy_bwd)


def cross_entropy(x_BxTxE: Array, w_VxE: Array, targets_BxT: Array, *, tile: int,
                  scale: float = 1.0, rounding: str | None = None) -> tuple[Array, Array]:
  """(ce_BxT, correct_BxT) of the head ``(x @ w.T) * scale`` over tiles of ``tile`` tokens.

  ``rounding`` (a dtype name or None): cast x to it and round the logits to it before float32,
  as a head computing in that dtype does. Differentiable in x and w (custom VJP); ``correct``
  (1.0 where the argmax is the target) carries no gradient.
  """
  if tile < 1:
    raise ValueError(f"tile must be >= 1 token, got {tile}")
  if x_BxTxE.shape[:2] != targets_BxT.shape:
    raise ValueError(f"x {x_BxTxE.shape} and targets {targets_BxT.shape} disagree on B x T")
  return _cross_entropy(x_BxTxE, w_VxE, targets_BxT.astype(jnp.int32), min(tile, x_BxTxE.shape[1]),
                        float(scale), rounding)
