"""Causal load balancing of the ring: device d holds token chunks d and 2n-1-d.

A row of T tokens is cut into 2n chunks of c = T / (2n) over the n devices of the context axis.
In the natural layout device d holds chunks 2d and 2d+1; under causal attention the last device
then has n times the first one's work (its queries see every earlier key). In the balanced
layout device d holds chunk d (slot 0) and chunk 2n-1-d (slot 1): an early and a late chunk, so
every device sees the same number of visible (query, key) pairs, and at every hop of the ring
exactly half of the held key block can be seen (attention/ring.py skips the other half).

``reorder`` moves [B, T, ...] arrays between the layouts with two collective-permutes of c
tokens per device (each device sends its two chunks to their two homes); the model reorders its
token inputs on entry and its hidden states back before the head (model.py), so the logits,
the loss and the gradients are those of the natural order. ``token_index`` gives the row index
of each token a device holds, from which the ring's causal mask is built.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from chunkformer.attention import context_axis

Array = jax.Array


def token_index(device: Array | int, n: int, local_len: int, balanced: bool) -> Array:
  """index_L: the row index of each of the ``local_len`` tokens device ``device`` holds."""
  j = jnp.arange(local_len, dtype=jnp.int32)
  if not balanced:
    return device * local_len + j
  c = local_len // 2
  late = j >= c  # slot 1 holds chunk 2n-1-d
  return jnp.where(late, (2 * n - 1 - device) * c + (j - c), device * c + j)


def _home(chunk: int, n: int) -> int:
  """The device that holds ``chunk`` (of 2n) in the balanced layout."""
  return chunk if chunk < n else 2 * n - 1 - chunk


def _permutations(n: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
  """(source, destination) of each device's even chunk 2e and of its odd chunk 2e+1.

  Each is a permutation of the devices: even chunks below n land on even devices and those
  above on odd ones (and the other way round for odd chunks), so one collective-permute moves
  every device's even chunk and a second its odd chunk.
  """
  return ([(e, _home(2 * e, n)) for e in range(n)],
          [(e, _home(2 * e + 1, n)) for e in range(n)])


def _to_balanced(x: Array, axis: str, n: int) -> Array:
  c = x.shape[1] // 2
  even, odd = _permutations(n)
  got_even = jax.lax.ppermute(x[:, :c], axis, even)
  got_odd = jax.lax.ppermute(x[:, c:], axis, odd)
  # Device d's slot 0 is chunk d: an even chunk on an even device, an odd one on an odd device.
  d_even = jax.lax.axis_index(axis) % 2 == 0
  return jnp.concatenate([jnp.where(d_even, got_even, got_odd),
                          jnp.where(d_even, got_odd, got_even)], axis=1)


def _to_natural(x: Array, axis: str, n: int) -> Array:
  c = x.shape[1] // 2
  even, odd = _permutations(n)
  d_even = jax.lax.axis_index(axis) % 2 == 0
  even_chunk = jnp.where(d_even, x[:, :c], x[:, c:])
  odd_chunk = jnp.where(d_even, x[:, c:], x[:, :c])
  back_even = jax.lax.ppermute(even_chunk, axis, [(b, a) for a, b in even])
  back_odd = jax.lax.ppermute(odd_chunk, axis, [(b, a) for a, b in odd])
  return jnp.concatenate([back_even, back_odd], axis=1)


def reorder(x_BxTx_: Array, logical_names: tuple[str | None, ...],
            axis: context_axis.ContextAxis, *, inverse: bool = False) -> Array:
  """``x`` (token axis 1, split over ``axis``) from the natural to the balanced layout, or back.

  ``logical_names`` name x's axes (``("batch", "length", ...)``); the other axes keep the
  sharding the rules give them. T must be a multiple of 2n.
  """
  t = x_BxTx_.shape[1]
  if t % (2 * axis.size):
    raise ValueError(f"load balancing: {t} tokens do not split into 2 x {axis.size} chunks")
  spec = context_axis.spec(logical_names)
  move = _to_natural if inverse else _to_balanced
  return jax.shard_map(lambda x: move(x, axis.name, axis.size), in_specs=spec,
                       out_specs=spec)(x_BxTx_)
