"""Optimiser and the training state, created already sharded over the mesh.

``create`` never materialises an unsharded copy: the init function is traced abstractly
(``jax.eval_shape``), its logical axis names become shardings, and the jitted init writes
every array straight into its shards.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from chunkformer import sharding as sharding_lib
from chunkformer.config import Config, TrainConfig


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
  """AdamW (weight decay on matrices only, not on norm scales) after global-norm clipping."""
  return optax.chain(
      optax.clip_by_global_norm(train.grad_clip),
      optax.adamw(learning_rate_schedule(train), b1=train.b1, b2=train.b2,
                  weight_decay=train.weight_decay,
                  mask=lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)),
  )


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
