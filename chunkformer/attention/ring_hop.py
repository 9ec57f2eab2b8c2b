"""One hop of the ring: a device's queries against one key/value block, in tiles of queries.

Both passes of ``attention.ring`` call these once per hop. ``stats`` returns the online-softmax
statistics of the hop (running max, denominator, unnormalised output) that the forward ring
merges across hops; ``grads`` recomputes the hop's probabilities from the log-sum-exp the
forward saved and returns dq for the queries and dk, dv for the block. The queries are cut into
tiles of at most ``tile`` tokens (``lax.map`` / ``lax.scan``), so a step holds tile x M scores
per head where the whole hop would hold L x M (at 131,072 tokens on 8 devices, 16,384 x 16,384
float32 per head: 1 GiB).

Visibility is the dense rule (``common.document_causal_mask``) on row indices: key s is visible
to query t iff idx_k[s] <= idx_q[t] and both carry the same document id. Logits, softmax and
every accumulation are float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array
_F32 = jnp.float32
_MAX_FLOOR = -1e30  # running-max floor: a query that sees nothing in a block gets exp(-inf) = 0

Stats = tuple[Array, Array, Array]  # m_BxKxGxL, l_BxKxGxL, acc_BxKxGxLxD


def _logits(q_BxLxKxGxD, k_BxMxKxD, seg_q_BxL, seg_k_BxM, idx_q_L, idx_k_M, scale) -> Array:
  """Masked float32 logits BxKxGxLxM."""
  s = jnp.einsum("blkgd,bmkd->bkglm", q_BxLxKxGxD, k_BxMxKxD, preferred_element_type=_F32)
  visible = (idx_k_M[None, :] <= idx_q_L[:, None])[None] & (
      seg_q_BxL[:, :, None] == seg_k_BxM[:, None, :])
  return jnp.where(visible[:, None, None], s * scale, -jnp.inf)


def _split(length: int, tile: int) -> tuple[int, int]:
  """(tiles, tokens per tile): the fewest tiles of at most ``tile``, as even as they come."""
  count = -(-length // max(1, min(tile, length)))
  return count, -(-length // count)


def _tiled(x: Array, axis: int, count: int, size: int, fill=0) -> Array:
  """x with its query axis padded to count * size and cut into tiles, the tile index first."""
  pad = count * size - x.shape[axis]
  if pad:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    x = jnp.pad(x, widths, constant_values=fill)
  x = x.reshape(*x.shape[:axis], count, size, *x.shape[axis + 1:])
  return jnp.moveaxis(x, axis, 0)


def _untiled(x: Array, axis: int, length: int) -> Array:
  """The inverse of ``_tiled`` (tile index first, then the tile's own ``axis``); padding cut."""
  x = jnp.moveaxis(x, 0, axis)
  x = x.reshape(*x.shape[:axis], -1, *x.shape[axis + 2:])
  return jax.lax.slice_in_dim(x, 0, length, axis=axis)


def _query_tiles(q, seg_q, idx_q, tile):
  count, size = _split(q.shape[1], tile)
  # Padded queries get row index -1: no key is at or before them, so they see nothing.
  return count, size, (_tiled(q, 1, count, size), _tiled(seg_q, 1, count, size),
                       _tiled(idx_q, 0, count, size, fill=-1))


def _tied(q, seg_q, idx_q):
  """A tile's queries, document ids and row indices, bound together so that the mask is
  computed where the logits are. Differentiated under remat inside a loop (the model's scanned
  layers), JAX would otherwise compute the masks, which depend on integers alone, ahead of the
  tiles and keep every tile's (tile x M per head, boolean) for the recomputation."""
  return jax.lax.optimization_barrier((q, seg_q, idx_q))


def stats(q_BxLxKxGxD: Array, k_BxMxKxD: Array, v_BxMxKxD: Array, seg_q_BxL: Array,
          seg_k_BxM: Array, idx_q_L: Array, idx_k_M: Array, scale: float, tile: int) -> Stats:
  """The masked softmax statistics of the queries against one key block."""
  length = q_BxLxKxGxD.shape[1]
  _, _, tiles = _query_tiles(q_BxLxKxGxD, seg_q_BxL, idx_q_L, tile)
  v = v_BxMxKxD.astype(_F32)

  def one_tile(args):
    q, seg_q, idx_q = _tied(*args)
    s = _logits(q, k_BxMxKxD, seg_q, seg_k_BxM, idx_q, idx_k_M, scale)
    m = jnp.maximum(jnp.max(s, axis=-1), _MAX_FLOOR)
    p = jnp.exp(s - m[..., None])
    return m, jnp.sum(p, axis=-1), jnp.einsum("bkglm,bmkd->bkgld", p, v)

  m, denom, acc = jax.lax.map(one_tile, tiles)
  return _untiled(m, 3, length), _untiled(denom, 3, length), _untiled(acc, 3, length)


def empty_stats(like: Array, b: int, kh: int, g: int, length: int, d: int) -> Stats:
  """The statistics of queries that see nothing, varying over the mesh axes ``like`` does (as
  the other branch of a ``lax.cond`` must)."""
  return (jnp.full_like(like, _MAX_FLOOR, _F32, (b, kh, g, length)),
          jnp.full_like(like, 0, _F32, (b, kh, g, length)),
          jnp.full_like(like, 0, _F32, (b, kh, g, length, d)))


def merge(a: Stats, b: Stats) -> Stats:
  """Two key blocks' statistics of the same queries as one (the online-softmax recurrence)."""
  m = jnp.maximum(a[0], b[0])
  wa, wb = jnp.exp(a[0] - m), jnp.exp(b[0] - m)
  return m, a[1] * wa + b[1] * wb, a[2] * wa[..., None] + b[2] * wb[..., None]


def grads(q_BxLxKxGxD: Array, k_BxMxKxD: Array, v_BxMxKxD: Array, seg_q_BxL: Array,
          seg_k_BxM: Array, idx_q_L: Array, idx_k_M: Array, do_BxLxKxGxD: Array,
          lse_BxKxGxL: Array, delta_BxKxGxL: Array, scale: float,
          tile: int) -> tuple[Array, Array, Array]:
  """dq_BxLxKxGxD, dk_BxMxKxD, dv_BxMxKxD (float32) of one key block's share of the output.

  ``lse`` is each query's log-sum-exp over every key it sees (all hops), so exp(s - lse) is the
  hop's share of the final probabilities; ``delta`` = sum_d do * o, the softmax Jacobian's row
  term. dk and dv sum over the tiles (and the G query heads of a kv head).
  """
  length = q_BxLxKxGxD.shape[1]
  count, size, tiles = _query_tiles(q_BxLxKxGxD, seg_q_BxL, idx_q_L, tile)
  do = _tiled(do_BxLxKxGxD, 1, count, size)
  lse, delta = (_tiled(x, 3, count, size) for x in (lse_BxKxGxL, delta_BxKxGxL))
  k, v = k_BxMxKxD.astype(_F32), v_BxMxKxD.astype(_F32)

  def one_tile(carry, args):
    dk, dv = carry
    q, seg_q, idx_q, do, lse, delta = args
    q, seg_q, idx_q = _tied(q, seg_q, idx_q)
    s = _logits(q, k_BxMxKxD, seg_q, seg_k_BxM, idx_q, idx_k_M, scale)
    p = jnp.exp(s - lse[..., None])  # masked (and padded) logits are -inf: p = 0 there
    do = do.astype(_F32)
    dp = jnp.einsum("blkgd,bmkd->bkglm", do, v)
    ds = p * (dp - delta[..., None]) * scale
    dv = dv + jnp.einsum("bkglm,blkgd->bmkd", p, do)
    dk = dk + jnp.einsum("bkglm,blkgd->bmkd", ds, q.astype(_F32))
    return (dk, dv), jnp.einsum("bkglm,bmkd->blkgd", ds, k)

  # The carry varies over every mesh axis the queries do (the loop's output must match it).
  zeros = jnp.full_like(q_BxLxKxGxD, 0, _F32, k_BxMxKxD.shape)
  (dk, dv), dq = jax.lax.scan(one_tile, (zeros, zeros), (*tiles, do, lse, delta))
  return _untiled(dq, 1, length), dk, dv
