"""Gradients of one update, optionally accumulated over micro-batches (train.grad_accum_steps).

With k micro-batches the batch's B rows are split into k micro-batches of B/k rows (row
j*k + i goes to micro-batch i, so each micro-batch keeps the batch's sharding over rows), and
``jax.lax.scan`` adds their gradients in float32. Each micro-batch's cross-entropy is divided by
the scored tokens of the *whole* batch, so the sum equals the gradient of the whole batch's
mean loss (up to float rounding): k micro-batches equal one batch k times larger. Sown
auxiliary losses (the dynamic kind's ratio loss) enter as the mean over micro-batches, which
is the batch's value only for losses linear in the batch. Only activation memory shrinks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from chunkformer import objective

Array = jax.Array


def split_micro_batches(batch: Mapping[str, Array], steps: int) -> dict[str, Array]:
  """[B, ...] -> [steps, B/steps, ...], micro-batch i holding rows i, i + steps, ..."""
  def split(x):
    rows = x.shape[0]
    return x.reshape((rows // steps, steps) + x.shape[1:]).swapaxes(0, 1)

  return {k: split(v) for k, v in batch.items()}


def grads_and_sums(params: Any, model: nn.Module, batch: Mapping[str, Array], rng: Array,
                   steps: int = 1) -> tuple[Any, dict[str, Array]]:
  """(gradients of the batch's training loss, additive metric sums of the batch)."""
  grad_fn = jax.grad(objective.loss_fn, has_aux=True)
  if steps == 1:
    return grad_fn(params, model, batch, rng, True)
  micro = split_micro_batches(batch, steps)
  count = jnp.sum(batch["loss_mask"])

  def one(mb, i):
    mb = {k: nn.with_logical_constraint(v, ("batch", "length")) for k, v in mb.items()}
    return grad_fn(params, model, mb, jax.random.fold_in(rng, i), True, count, 1.0 / steps)

  first = {k: v[0] for k, v in micro.items()}
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32),
                       jax.eval_shape(one, first, 0))

  def body(acc, xs):
    mb, i = xs
    return jax.tree.map(lambda a, x: a + x.astype(jnp.float32), acc, one(mb, i)), None

  (grads, sums), _ = jax.lax.scan(body, zeros, (micro, jnp.arange(steps)))
  grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
  return grads, sums
