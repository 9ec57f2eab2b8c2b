"""Full attention with K/V passed round a ring of the context devices (``context_strategy: ring``).

Each of the n devices of the context axis holds the queries, keys, values and document ids of
its own T/n tokens. It attends its queries to the block it holds, then passes that K/V block
(with its document ids) to the next device and receives the previous one's, n-1 times, so after
the last hop it has seen every block. Partial results are merged with the online-softmax
(log-sum-exp) recurrence: a running max m, denominator l and unnormalised output per query.
No device ever holds more than two K/V blocks (the one it computes on and the one arriving),
where the all-gather strategy holds all T keys and values.

Visibility is the dense rule (``common.document_causal_mask``) on the row indices of the tokens
(``load_balance.token_index``, which also covers the balanced layout): key s is visible to
query t iff s <= t and both lie in the same document, so documents may cross shard edges. A
hop whose block lies wholly after the device's queries is skipped (``lax.cond``): without load
balancing that is every block from a later device; with it, exactly half of every held block
is computed (the early chunk for all queries, or all keys for the late chunk).

Differentiated by JAX (the transpose of a collective-permute is the reverse permute), so the
backward pass sends dK/dV blocks the other way round the ring. It keeps each hop's K/V block
for the backward (T tokens per device in all, as the all-gather holds them) but not its
probabilities, which are recomputed hop by hop (``jax.checkpoint``). Logits, softmax and
accumulation are float32; the output has q's dtype.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from chunkformer.attention import context_axis, load_balance

Array = jax.Array
_F32 = jnp.float32
_MAX_FLOOR = -1e30  # running-max floor: a query that sees nothing in a block gets exp(-inf) = 0

Partial = tuple[Array, Array, Array]  # m_BxKxGxL, l_BxKxGxL, acc_BxKxGxLxD


@functools.partial(jax.checkpoint, static_argnums=(7,))
def _partial(q_BxLxKxGxD, k_BxMxKxD, v_BxMxKxD, seg_q_BxL, seg_k_BxM, idx_q_L, idx_k_M,
             scale) -> Partial:
  """Masked softmax statistics of one query block against one key block.

  Rematerialised: the backward pass recomputes a hop's L x M probabilities instead of keeping
  every hop's (T/n x T per head in all, the dense path's memory).
  """
  s = jnp.einsum("blkgd,bmkd->bkglm", q_BxLxKxGxD, k_BxMxKxD, preferred_element_type=_F32)
  visible = (idx_k_M[None, :] <= idx_q_L[:, None])[None] & (
      seg_q_BxL[:, :, None] == seg_k_BxM[:, None, :])
  s = jnp.where(visible[:, None, None], s * scale, -jnp.inf)
  # The output does not depend on the max (it cancels), so no gradient flows through it.
  m = jax.lax.stop_gradient(jnp.maximum(jnp.max(s, axis=-1), _MAX_FLOOR))
  p = jnp.exp(s - m[..., None])
  return m, jnp.sum(p, axis=-1), jnp.einsum("bkglm,bmkd->bkgld", p, v_BxMxKxD.astype(_F32))


def _empty(like: Array, b: int, kh: int, g: int, length: int, d: int) -> Partial:
  """The statistics of queries that see nothing, varying over the mesh axes ``like`` does (as
  the other branch of a ``lax.cond`` must)."""
  return (jnp.full_like(like, _MAX_FLOOR, _F32, (b, kh, g, length)),
          jnp.full_like(like, 0, _F32, (b, kh, g, length)),
          jnp.full_like(like, 0, _F32, (b, kh, g, length, d)))


def _merge(a: Partial, b: Partial) -> Partial:
  m = jnp.maximum(a[0], b[0])
  wa, wb = jnp.exp(a[0] - m), jnp.exp(b[0] - m)
  return m, a[1] * wa + b[1] * wb, a[2] * wa[..., None] + b[2] * wb[..., None]


def _concat(a: Partial, b: Partial) -> Partial:
  """Two query blocks' statistics as one (queries are axis 3 of each)."""
  return tuple(jnp.concatenate([x, y], axis=3) for x, y in zip(a, b, strict=True))


def _hop(q, kv, seg_q, idx_q, idx_k, device, source, balanced, scale) -> Partial:
  """This device's queries against the block that came from ``source`` (not itself)."""
  k, v, seg_k = kv
  b, length, kh, g, d = q.shape
  if not balanced:
    # An earlier device's block is wholly visible to causality, a later one's wholly hidden.
    return jax.lax.cond(source < device,
                        lambda: _partial(q, k, v, seg_q, seg_k, idx_q, idx_k, scale),
                        lambda: _empty(q, b, kh, g, length, d))
  c = length // 2

  def early_keys():  # source < device: its early chunk precedes both of ours, its late follows
    return _partial(q, k[:, :c], v[:, :c], seg_q, seg_k[:, :c], idx_q, idx_k[:c], scale)

  def late_queries():  # source > device: only our late chunk follows any of its keys, all of them
    late = _partial(q[:, c:], k, v, seg_q[:, c:], seg_k, idx_q[c:], idx_k, scale)
    return _concat(_empty(q, b, kh, g, c, d), late)

  return jax.lax.cond(source < device, early_keys, late_queries)


def _ring_local(q_BxLxHxD, k_BxLxKxD, v_BxLxKxD, seg_BxL, *, axis: str, n: int, balanced: bool,
                heads_axis: str | None, num_heads: int, num_kv_heads: int) -> Array:
  b, length, h_local, d = q_BxLxHxD.shape
  scale = d**-0.5
  device = jax.lax.axis_index(axis)
  if heads_axis is not None and 1 < num_kv_heads < num_heads:
    # The query heads are split (tensor) but the kv heads are not (too few): each local query
    # head reads its own kv head, picked here so the ring still carries the K kv heads only.
    group = num_heads // num_kv_heads
    first = jax.lax.axis_index(heads_axis) * h_local
    kv_of_head = (first + jnp.arange(h_local)) // group
    pick = lambda x: jnp.take(x, kv_of_head, axis=2)  # noqa: E731
  else:
    pick = lambda x: x  # noqa: E731
  kh = pick(k_BxLxKxD).shape[2]
  q = q_BxLxHxD.reshape(b, length, kh, h_local // kh, d)
  idx_q = load_balance.token_index(device, n, length, balanced)
  stats = _partial(q, pick(k_BxLxKxD), pick(v_BxLxKxD), seg_BxL, seg_BxL, idx_q, idx_q, scale)
  kv = (k_BxLxKxD, v_BxLxKxD, seg_BxL)
  to_next = [(i, (i + 1) % n) for i in range(n)]
  for hop in range(1, n):
    kv = jax.lax.ppermute(kv, axis, to_next)
    source = (device - hop) % n
    idx_k = load_balance.token_index(source, n, length, balanced)
    held = (pick(kv[0]), pick(kv[1]), kv[2])
    stats = _merge(stats, _hop(q, held, seg_BxL, idx_q, idx_k, device, source, balanced, scale))
  _, denom, acc = stats
  # Step 0 held each query's own key (visible to itself), so every denominator is >= exp(0)
  # relative to its max: no division by zero.
  o = acc / denom[..., None]  # BxKxGxLxD
  o = jnp.moveaxis(o, 3, 1).reshape(b, length, h_local, d)
  return o.astype(q_BxLxHxD.dtype)


def ring_attention(q_BxTxHxD: Array, k_BxTxKxD: Array, v_BxTxKxD: Array, segment_ids_BxT: Array,
                   axis: context_axis.ContextAxis, *, balanced: bool) -> Array:
  """Document-causal GQA attention with the tokens split over ``axis``; o_BxTxHxD.

  ``balanced``: the arrays are in the load-balanced layout (``load_balance.reorder``) and the
  output is too. The batch and head axes keep the shardings the axis rules give them.
  """
  q_spec = context_axis.spec(("batch", "length", "heads", "head_dim"))
  kv_spec = context_axis.spec(("batch", "length", "kv_heads", "head_dim"))
  seg_spec = context_axis.spec(("batch", "length"))
  heads_axis, kv_heads_axis = q_spec[2], kv_spec[2]
  if kv_heads_axis is not None and kv_heads_axis != heads_axis:
    raise ValueError(f"ring attention: kv heads split over {kv_heads_axis} but query heads over "
                     f"{heads_axis}; map 'heads' and 'kv_heads' to the same mesh axes")
  if isinstance(heads_axis, tuple):
    if len(heads_axis) > 1 and kv_heads_axis is None:
      raise ValueError(f"ring attention: query heads split over several axes {heads_axis} "
                       "while the kv heads are not split")
    heads_axis = heads_axis[0] if heads_axis else None
  local = lambda q, k, v, s: _ring_local(  # noqa: E731
      q, k, v, s, axis=axis.name, n=axis.size, balanced=balanced,
      heads_axis=heads_axis if kv_heads_axis is None else None,
      num_heads=q_BxTxHxD.shape[2], num_kv_heads=k_BxTxKxD.shape[2])
  return jax.shard_map(local, in_specs=(q_spec, kv_spec, kv_spec, seg_spec),
                       out_specs=q_spec)(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT)
