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

A custom VJP in the style of ring (flash) attention: the forward keeps only the local q, k, v,
the output and each query's log-sum-exp. The backward passes the K/V blocks round the ring a
second time, recomputing each hop's probabilities from the log-sum-exp; the block's dK/dV
(float32) travel with it, each device adding its queries' share, and come home after n hops
(the n-th send carries only them); dq stays on its device. Each hop's work is cut into tiles
of queries (``ring_hop``), so no step holds more than a tile's scores against one block.
``backward="autodiff"`` lets JAX differentiate the forward ring instead (it keeps every hop's
blocks and scores: the tests' second reference). Logits, softmax and accumulation are float32;
the output has q's dtype.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from chunkformer.attention import context_axis, load_balance, ring_hop

Array = jax.Array
_F32 = jnp.float32
QUERY_TILE = 512  # queries per step of a hop: 512 x T/n float32 scores per head
BACKWARDS = ("ring", "autodiff")


@dataclasses.dataclass(frozen=True)
class _Ring:
  """The static layout of one ring: its axis, devices, chunk order and head split."""
  axis: str
  n: int
  balanced: bool
  heads_axis: str | None  # query heads split over it while the kv heads are whole
  num_heads: int
  num_kv_heads: int
  tile: int


def _picker(ring: _Ring, h_local: int):
  """(pick, unpick): a K/V block's kv heads for the local query heads, and its transpose."""
  if ring.heads_axis is None or not 1 < ring.num_kv_heads < ring.num_heads:
    return (lambda x: x), (lambda dx: dx)
  # The query heads are split (tensor) but the kv heads are not (too few): each local query
  # head reads its own kv head, picked here so the ring still carries the K kv heads only.
  group = ring.num_heads // ring.num_kv_heads
  first = jax.lax.axis_index(ring.heads_axis) * h_local
  kv_of_head = (first + jnp.arange(h_local)) // group

  def unpick(dx_BxMxHxD):
    shape = (*dx_BxMxHxD.shape[:2], ring.num_kv_heads, dx_BxMxHxD.shape[3])
    return jnp.zeros(shape, dx_BxMxHxD.dtype).at[:, :, kv_of_head].add(dx_BxMxHxD)

  return (lambda x: jnp.take(x, kv_of_head, axis=2)), unpick


def _hop_stats(q, held, seg_q, idx_q, idx_k, device, source, ring, scale) -> ring_hop.Stats:
  """This device's queries against the block that came from ``source`` (not itself)."""
  k, v, seg_k = held
  b, length, kh, g, d = q.shape
  empty = functools.partial(ring_hop.empty_stats, q, b, kh, g)
  stats = functools.partial(ring_hop.stats, scale=scale, tile=ring.tile)
  if not ring.balanced:
    # An earlier device's block is wholly visible to causality, a later one's wholly hidden.
    return jax.lax.cond(source < device,
                        lambda: stats(q, k, v, seg_q, seg_k, idx_q, idx_k),
                        lambda: empty(length, d))
  c = length // 2

  def early_keys():  # source < device: its early chunk precedes both of ours, its late follows
    return stats(q, k[:, :c], v[:, :c], seg_q, seg_k[:, :c], idx_q, idx_k[:c])

  def late_queries():  # source > device: only our late chunk follows any of its keys, all of them
    late = stats(q[:, c:], k, v, seg_q[:, c:], seg_k, idx_q[c:], idx_k)
    return tuple(jnp.concatenate([x, y], axis=3) for x, y in zip(empty(c, d), late, strict=True))

  return jax.lax.cond(source < device, early_keys, late_queries)


def _hop_grads(q, held, seg_q, idx_q, idx_k, do, lse, delta, device, source, ring, scale):
  """dq of this device's queries and dk, dv of the block from ``source``: the same skips as
  ``_hop_stats``, the parts not computed zero."""
  k, v, seg_k = held
  grads = functools.partial(ring_hop.grads, scale=scale, tile=ring.tile)
  zeros = lambda shape: jnp.full_like(q, 0, _F32, shape)  # noqa: E731  (q's mesh axes)
  if not ring.balanced:
    return jax.lax.cond(source < device,
                        lambda: grads(q, k, v, seg_q, seg_k, idx_q, idx_k, do, lse, delta),
                        lambda: (zeros(q.shape), zeros(k.shape), zeros(v.shape)))
  c = q.shape[1] // 2

  def early_keys():
    dq, dk, dv = grads(q, k[:, :c], v[:, :c], seg_q, seg_k[:, :c], idx_q, idx_k[:c], do, lse,
                       delta)
    rest = zeros((k.shape[0], k.shape[1] - c, *k.shape[2:]))
    return dq, jnp.concatenate([dk, rest], axis=1), jnp.concatenate([dv, rest], axis=1)

  def late_queries():
    dq, dk, dv = grads(q[:, c:], k, v, seg_q[:, c:], seg_k, idx_q[c:], idx_k, do[:, c:],
                       lse[..., c:], delta[..., c:])
    return jnp.concatenate([zeros((q.shape[0], c, *q.shape[2:])), dq], axis=1), dk, dv

  return jax.lax.cond(source < device, early_keys, late_queries)


def _forward(ring: _Ring, q_BxLxHxD, k_BxLxKxD, v_BxLxKxD, seg_BxL):
  """o_BxLxHxD (q's dtype) and lse_BxKxGxL (float32) of this device's queries over every key."""
  b, length, h_local, d = q_BxLxHxD.shape
  scale = d**-0.5
  pick, _ = _picker(ring, h_local)
  q = q_BxLxHxD.reshape(b, length, pick(k_BxLxKxD).shape[2], -1, d)
  device = jax.lax.axis_index(ring.axis)
  idx_q = load_balance.token_index(device, ring.n, length, ring.balanced)
  stats = ring_hop.stats(q, pick(k_BxLxKxD), pick(v_BxLxKxD), seg_BxL, seg_BxL, idx_q, idx_q,
                         scale, ring.tile)
  kv = (k_BxLxKxD, v_BxLxKxD, seg_BxL)
  to_next = [(i, (i + 1) % ring.n) for i in range(ring.n)]
  for hop in range(1, ring.n):
    kv = jax.lax.ppermute(kv, ring.axis, to_next)
    source = (device - hop) % ring.n
    idx_k = load_balance.token_index(source, ring.n, length, ring.balanced)
    held = (pick(kv[0]), pick(kv[1]), kv[2])
    stats = ring_hop.merge(stats, _hop_stats(q, held, seg_BxL, idx_q, idx_k, device, source,
                                             ring, scale))
  m, denom, acc = stats
  # Step 0 held each query's own key (visible to itself), so every denominator is >= exp(0)
  # relative to its max: no division by zero, and the log-sum-exp is finite.
  o = jnp.moveaxis(acc / denom[..., None], 3, 1).reshape(b, length, h_local, d)
  return o.astype(q_BxLxHxD.dtype), m + jnp.log(denom)


def _backward(ring: _Ring, q_BxLxHxD, k_BxLxKxD, v_BxLxKxD, seg_BxL, o_BxLxHxD, lse_BxKxGxL,
              do_BxLxHxD):
  """dq, dk, dv of this device's blocks: K/V round the ring again, dK/dV travelling with them."""
  b, length, h_local, d = q_BxLxHxD.shape
  scale = d**-0.5
  pick, unpick = _picker(ring, h_local)
  kh = lse_BxKxGxL.shape[1]
  q, do, o = (x.reshape(b, length, kh, -1, d) for x in (q_BxLxHxD, do_BxLxHxD, o_BxLxHxD))
  delta = jnp.einsum("blkgd,blkgd->bkgl", do.astype(_F32), o.astype(_F32))
  device = jax.lax.axis_index(ring.axis)
  idx_q = load_balance.token_index(device, ring.n, length, ring.balanced)
  dq, dk, dv = ring_hop.grads(q, pick(k_BxLxKxD), pick(v_BxLxKxD), seg_BxL, seg_BxL, idx_q,
                              idx_q, do, lse_BxKxGxL, delta, scale, ring.tile)
  kv, dkv = (k_BxLxKxD, v_BxLxKxD, seg_BxL), (unpick(dk), unpick(dv))
  to_next = [(i, (i + 1) % ring.n) for i in range(ring.n)]
  for hop in range(1, ring.n):
    # A block's dK/dV ride with it: each device adds its queries' share before passing both on.
    kv, dkv = jax.lax.ppermute((kv, dkv), ring.axis, to_next)
    source = (device - hop) % ring.n
    idx_k = load_balance.token_index(source, ring.n, length, ring.balanced)
    held = (pick(kv[0]), pick(kv[1]), kv[2])
    dq_h, dk_h, dv_h = _hop_grads(q, held, seg_BxL, idx_q, idx_k, do, lse_BxKxGxL, delta,
                                  device, source, ring, scale)
    dq, dkv = dq + dq_h, (dkv[0] + unpick(dk_h), dkv[1] + unpick(dv_h))
  # The block held last came from the next device (device + 1 = device - (n-1)): home.
  dk, dv = jax.lax.ppermute(dkv, ring.axis, to_next)
  if ring.heads_axis is not None:
    # K/V are whole along the heads axis that splits the queries: every device of it added
    # its own heads' share, and each holds the same K/V, so the gradient is their sum.
    dk, dv = jax.lax.psum((dk, dv), ring.heads_axis)
  return (dq.reshape(q_BxLxHxD.shape).astype(q_BxLxHxD.dtype), dk.astype(k_BxLxKxD.dtype),
          dv.astype(v_BxLxKxD.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ring_vjp(ring: _Ring, q, k, v, seg):
  return _forward(ring, q, k, v, seg)[0]


def _ring_vjp_fwd(ring: _Ring, q, k, v, seg):
  o, lse = _forward(ring, q, k, v, seg)
  return o, (q, k, v, seg, o, lse)


def _ring_vjp_bwd(ring: _Ring, residuals, do):
  q, k, v, seg, o, lse = residuals
  return (*_backward(ring, q, k, v, seg, o, lse, do), None)


_ring_vjp.defvjp(_ring_vjp_fwd, _ring_vjp_bwd)


def ring_attention(q_BxTxHxD: Array, k_BxTxKxD: Array, v_BxTxKxD: Array, segment_ids_BxT: Array,
                   axis: context_axis.ContextAxis, *, balanced: bool, query_tile: int = QUERY_TILE,
                   backward: str = "ring") -> Array:
  """Document-causal GQA attention with the tokens split over ``axis``; o_BxTxHxD.

  ``balanced``: the arrays are in the load-balanced layout (``load_balance.reorder``) and the
  output is too. The batch and head axes keep the shardings the axis rules give them.
  ``query_tile``: queries per step of a hop. ``backward``: ``ring`` (the custom VJP) or
  ``autodiff`` (JAX differentiates the forward ring).
  """
  if backward not in BACKWARDS:
    raise ValueError(f"ring attention: backward must be one of {BACKWARDS}, got {backward!r}")
  if query_tile < 1:
    raise ValueError(f"ring attention: query_tile must be >= 1, got {query_tile}")
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
  ring = _Ring(axis=axis.name, n=axis.size, balanced=balanced,
               heads_axis=heads_axis if kv_heads_axis is None else None,
               num_heads=q_BxTxHxD.shape[2], num_kv_heads=k_BxTxKxD.shape[2], tile=query_tile)
  if backward == "ring":
    local = functools.partial(_ring_vjp, ring)
  else:
    local = lambda *a: _forward(ring, *a)[0]  # noqa: E731
  return jax.shard_map(local, in_specs=(q_spec, kv_spec, kv_spec, seg_spec),
                       out_specs=q_spec)(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT)
