"""The dynamic kind's pooling with a row's tokens split over the context axis: entries per shard.

On one device ``kernels.segment_pool`` pools every closed chunk of the row into a buffer of the
row's capacity C (``chunking.boundaries.capacity``: ceil(T / min_chunk), padded). Partitioned
as written, each of the n shards would pool its tokens into all C slots and the shards would
sum the partial softmax statistics (an all-reduce of three B x (C + 1) x N arrays), so every
shard held and sent the whole row's capacity. Here (a ``jax.shard_map`` over the context axis)
each shard pools only the chunks its own L = T / n tokens touch:

- **Capacity per shard.** Two ends of closed chunks lie at least ``min_chunk`` tokens apart (a
  closed chunk holds that many), so at most ``E = ceil(L / min_chunk)`` chunks end inside a
  shard (``entries_per_shard``); the first of them may be the chunk that crosses the shard's
  left edge. One more chunk may cross its right edge and end in a later shard. So a shard pools
  into ``E + 1`` slots (plus one that collects the tokens of chunks that never close):
  slot i is the row's entry ``base + i``, ``base`` the entries that end before the shard.
- **Chunks across edges.** A shard's piece of the chunk crossing its right edge is its
  softmax statistics (running max, denominator, weighted sum per channel) and that chunk's
  entry number. Every shard's piece is all-gathered (n x 3N floats per row: one collective
  however many edges a chunk spans; with ``max_chunk > L + 1`` one chunk may span several
  shards, and a neighbour exchange would need n - 1 hops in turn), and the shard where the
  chunk ends merges the pieces with its entry number into its first slot by the log-sum-exp
  rule: the entry equals the one-device pooling up to float rounding.
- **Entries.** Each shard normalises the E entries that end inside it, the E x N entries of
  every shard are all-gathered, and each entry of the row's packed layout (the one-device
  layout, computed from the end flags outside) is read from the shard its end lies in, so the
  result, the padding's zeros included, is ``segment_pool``'s.

The backward pass is JAX's transpose: the entries' gradients, summed over the shards where the
attention's queries are split, go back to the shard that pooled each entry (a local slice);
the pieces' gradients are reduce-scattered back to their shards.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import kernels
from chunkformer.attention import context_axis

Array = jax.Array
_F32 = jnp.float32
_MAX_FLOOR = -1e30  # the max of an empty slot: exp(floor - m) = 0 against any real max


def entries_per_shard(shard_len: int, shortest_chunk: int) -> int:
  """Closed chunks that can end inside ``shard_len`` consecutive tokens: ceil(L / shortest)."""
  if shard_len < 1 or shortest_chunk < 1:
    raise ValueError(f"need positive shard_len and shortest_chunk, got {shard_len}, "
                     f"{shortest_chunk}")
  return -(-shard_len // shortest_chunk)


def _slot_stats(z_LxN: Array, v_LxN: Array, slot_L: Array, slots: int):
  """(max, denominator, weighted sum) of each slot's tokens, ``slots`` x N (float32)."""
  m = jax.lax.stop_gradient(jax.ops.segment_max(z_LxN, slot_L, num_segments=slots))
  m = jnp.maximum(m, _MAX_FLOOR)  # empty slots (-inf) merge as nothing
  p = jnp.exp(z_LxN - m[slot_L])
  return (m, jax.ops.segment_sum(p, slot_L, num_segments=slots),
          jax.ops.segment_sum(p * v_LxN.astype(_F32), slot_L, num_segments=slots))


def _bases(entry_ends_BxC: Array, n: int, length: int) -> Array:
  """base_BxS: entries of the row that end before shard s (the first slot of s is entry base)."""
  valid_BxC = entry_ends_BxC != kernels.PAD_END
  edges = jnp.arange(n) * length
  return jnp.sum(valid_BxC[:, None, :] & (entry_ends_BxC[:, None, :] < edges[None, :, None]),
                 axis=2, dtype=jnp.int32)


def _local(z_BxLxN, v_BxLxN, entry_of_token_BxL, entry_ends_BxC, *, axis: str, n: int,
           per_shard: int) -> Array:
  """entries_BxExN: the entries that end in this shard, merged with earlier shards' pieces."""
  b, length, _ = z_BxLxN.shape
  cap = entry_ends_BxC.shape[1]
  device = jax.lax.axis_index(axis)
  base_B = jnp.take(_bases(entry_ends_BxC, n, length), device, axis=1)
  valid_BxC = entry_ends_BxC != kernels.PAD_END
  last = jnp.sum(valid_BxC & (entry_ends_BxC < (device + 1) * length), axis=1, dtype=jnp.int32)
  ending_B = last - base_B  # entries that end in this shard (<= per_shard)
  slots = per_shard + 2  # per_shard + 1 pieces, and one for tokens of chunks never closed
  slot = entry_of_token_BxL - base_B[:, None]
  slot = jnp.where((entry_of_token_BxL < cap) & (slot >= 0) & (slot <= per_shard), slot,
                   slots - 1)
  m, den, num = jax.vmap(lambda z, v, s: _slot_stats(z, v, s, slots))(z_BxLxN, v_BxLxN, slot)

  # The piece of the chunk that crosses the right edge (empty if the shard's last token ends a
  # chunk), and that chunk's entry number; all-gathered, every shard sees every shard's piece.
  def right(x_BxSxN):
    return jnp.take_along_axis(x_BxSxN, ending_B[:, None, None], axis=1)[:, 0]

  pieces = [jax.lax.all_gather(right(x), axis) for x in (m, den, num)]  # n x B x N each
  piece_entry_NxB = jax.lax.all_gather(last, axis)
  # The first slot's chunk may have begun in earlier shards: merge their pieces of it.
  joins_NxB = (piece_entry_NxB == base_B[None]) & (jnp.arange(n) < device)[:, None]
  pm = jnp.where(joins_NxB[..., None], pieces[0], _MAX_FLOOR)
  top = jax.lax.stop_gradient(jnp.maximum(m[:, 0], jnp.max(pm, axis=0)))
  w_NxBxN, w0 = jnp.exp(pm - top), jnp.exp(m[:, 0] - top)
  den0 = den[:, 0] * w0 + jnp.sum(w_NxBxN * pieces[1], axis=0)
  num0 = num[:, 0] * w0 + jnp.sum(w_NxBxN * pieces[2], axis=0)
  den = jnp.concatenate([den0[:, None], den[:, 1:per_shard]], axis=1)
  num = jnp.concatenate([num0[:, None], num[:, 1:per_shard]], axis=1)
  return num / jnp.where(den > 0, den, 1.0)


def pool(values_BxTxN: Array, logits_BxTxN: Array, structure: kernels.ChunkStructure,
         slot_bias_SxN: Array | None, axis: context_axis.ContextAxis,
         shortest_chunk: int) -> Array:
  """entries_BxCxN: ``kernels.segment_pool(...)[0]`` of the same chunk ``structure`` (the
  row's packed layout), pooled with the tokens split over ``axis`` (module docstring)."""
  t = values_BxTxN.shape[1]
  if t % axis.size:
    raise ValueError(f"{t} tokens do not split over the {axis.size} devices of mesh axis "
                     f"{axis.name!r}")
  per_shard = entries_per_shard(t // axis.size, shortest_chunk)
  z = logits_BxTxN.astype(_F32)
  if slot_bias_SxN is not None:
    slot = jnp.minimum(structure.pos_in_chunk_BxT, slot_bias_SxN.shape[0] - 1)
    z = z + slot_bias_SxN.astype(_F32)[slot]
  token_spec = context_axis.spec(("batch", "length", None))
  local = lambda z, v, e, ends: _local(  # noqa: E731
      z, v, e, ends, axis=axis.name, n=axis.size, per_shard=per_shard)
  owned_BxnExN = jax.shard_map(
      local,
      in_specs=(token_spec, token_spec, context_axis.spec(("batch", "length")),
                context_axis.spec(("batch", None))),
      out_specs=token_spec)(z, values_BxTxN, structure.entry_of_token_BxT,
                            structure.entry_ends_BxC)
  # Every shard's entries on every shard (one all-gather; its transpose in the backward pass
  # is a local slice, the entries' gradients having been summed over the shards by then).
  gathered = jax.lax.with_sharding_constraint(owned_BxnExN,
                                              context_axis.spec(("batch", None, None)))
  # Each entry of the row from the shard its end lies in.
  ends_BxC = structure.entry_ends_BxC
  valid_BxC = ends_BxC != kernels.PAD_END
  length = t // axis.size
  shard_BxC = jnp.where(valid_BxC, ends_BxC // length, 0)
  base_BxC = jnp.take_along_axis(_bases(ends_BxC, axis.size, length), shard_BxC, axis=1)
  flat_BxC = jnp.where(valid_BxC, shard_BxC * per_shard + jnp.arange(ends_BxC.shape[1])
                       - base_BxC, 0)
  entries = jnp.take_along_axis(gathered, flat_BxC[..., None], axis=1)
  return jnp.where(valid_BxC[..., None], entries, 0.0).astype(values_BxTxN.dtype)
