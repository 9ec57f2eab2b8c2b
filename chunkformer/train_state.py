"""Optimiser and the training state, created already sharded over the mesh.

``create`` never materialises an unsharded copy: the init function is traced abstractly
(``jax.eval_shape``), its logical axis names become shardings, and the jitted init writes
every array straight into its shards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from chunkformer import sharding as sharding_lib
from chunkformer.config import Config, TrainConfig
from chunkformer.layers import TOKEN_SHIFT_MODULES


class TrainState(flax.struct.PyTreeNode):
  """Everything a checkpoint holds: the step (updates applied so far), params, optimiser."""

  step: jax.Array
  params: Any
  opt_state: Any


def learning_rate_schedule(train: TrainConfig) -> optax.Schedule:
  """Linear warmup from 0 to the peak, then cosine decay to ``peak * min_lr_ratio``."""
  peak = train.learning_rate
  warmup = optax.linear_schedule(0.0, peak, max(train.warmup_steps, 1))
  decay = optax.cosine_decay_schedule(peak, max(train.steps - train.warmup_steps, 1),
                                      alpha=train.min_lr_ratio)
  return optax.join_schedules([warmup, decay], [train.warmup_steps])


def make_optimizer(train: TrainConfig) -> optax.GradientTransformation:
  """AdamW (weight decay on matrices only, not on norm scales) after global-norm clipping;
  the token-shift weights held at their zero init for the first ``train.shift_frozen_steps``."""
  tx = optax.chain(
      optax.clip_by_global_norm(train.grad_clip),
      optax.adamw(learning_rate_schedule(train), b1=train.b1, b2=train.b2,
                  weight_decay=train.weight_decay,
                  mask=lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)),
  )
  if train.shift_frozen_steps:
    tx = freeze_for(tx, train.shift_frozen_steps, is_token_shift)
  return tx


Path = tuple[str, ...]  # a parameter's path of module and parameter names


def is_token_shift(path: Path) -> bool:
  """A weight of a token shift (``layers.TokenShift``, named for what it mixes into)."""
  return any(name in TOKEN_SHIFT_MODULES for name in path)


class FreezeState(NamedTuple):
  count: jax.Array  # updates applied so far
  inner: Any


def freeze_for(inner: optax.GradientTransformation, steps: int,
               frozen: Callable[[Path], bool]) -> optax.GradientTransformation:
  """``inner``, except that for the first ``steps`` updates the parameters whose path
  ``frozen`` accepts get zero gradient and zero update: AdamW neither moves nor decays them,
  their moments stay zero, and the global-norm clip sees only the others' gradients.

  ``frozen`` is called when the update is traced (training), never by ``init``, so that a
  predicate needing other runs (warm_start's new weights) is not asked when only restoring.
  """
  def init(params):
    return FreezeState(jnp.zeros((), jnp.int32), inner.init(params))

  def update(grads, state, params=None):
    held = state.count < steps

    def gate(path, x):
      if frozen(tuple(k.key for k in path)):
        return jnp.where(held, jnp.zeros_like(x), x)
      return x

    grads = jax.tree_util.tree_map_with_path(gate, grads)
    updates, inner_state = inner.update(grads, state.inner, params)
    updates = jax.tree_util.tree_map_with_path(gate, updates)
    return updates, FreezeState(state.count + 1, inner_state)

  return optax.GradientTransformation(init, update)


def init_tokens(config: Config) -> jax.ShapeDtypeStruct:
  """The dummy input that fixes parameter shapes (one row; parameters do not depend on B, T)."""
  return jnp.zeros((1, config.data.seq_len), jnp.int32)


def _boxed_init(model: nn.Module, tx: optax.GradientTransformation, config: Config):
  def init(rng: jax.Array) -> TrainState:
    params = model.init(rng, init_tokens(config))["params"]
    dtype = jnp.dtype(config.model.param_dtype)  # the optimiser state follows the params
    params = jax.tree.map(lambda p: p.astype(dtype) if p.dtype != dtype else p, params)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
  return init


def abstract_state(model: nn.Module, tx: optax.GradientTransformation, config: Config,
                   mesh: Mesh) -> tuple[TrainState, TrainState, sharding_lib.Rules]:
  """(abstract state with shardings, state shardings, fitted axis rules), computing nothing."""
  init = _boxed_init(model, tx, config)
  boxed = jax.eval_shape(init, jax.random.key(0))
  rules = sharding_lib.fit_rules(boxed, mesh, config.mesh.axis_rules)
  shardings = sharding_lib.shardings_of(boxed, mesh, rules)
  abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          nn.meta.unbox(boxed), shardings)
  return abstract, shardings, rules


def create(model: nn.Module, tx: optax.GradientTransformation, config: Config, mesh: Mesh,
           shardings: TrainState, rng: jax.Array) -> TrainState:
  """A freshly initialised state whose arrays are born in their shards."""
  init = _boxed_init(model, tx, config)
  with jax.set_mesh(mesh):
    return jax.jit(lambda r: nn.meta.unbox(init(r)), out_shardings=shardings)(rng)


def param_count(params: Any) -> int:
  return sum(int(x.size) for x in jax.tree.leaves(params))
