"""Start a run from another run's weights: ``init.from_workdir`` (e.g. an imported Qwen3).

The new run's model may differ from the source's only in how attention is computed
(``model.attention``, ``model.layer_pattern``: e.g. some layers become ``fixed`` or ``dynamic``),
in added token shifts, and in execution settings (``MAY_DIFFER``). Every parameter the source
has is loaded (same path, same shape); parameters only the new model has (compressors, routers,
sinks, token shifts) keep their fresh initialisation. ``plan`` checks this from the two configs
alone (abstract shapes) and raises ConfigError naming the field, or the parameter path and both
shapes, before anything is written; a source parameter the new model would drop is refused too.

``init.train_only_new_steps = N``: the first N updates change only the new parameters (the
loaded ones get zero gradient and zero update, so AdamW neither moves nor decays them and their
moments stay zero), letting fresh compressors adapt to a pretrained model before it all trains.
AdamW's step count runs on through the frozen steps, so the loaded weights' first updates after
unfreezing get a bias correction near 1 on moments that start from zero: smaller first steps,
a built-in warmup for the pretrained weights.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util

from chunkformer import train_state as state_lib
from chunkformer import workdir as workdir_lib
from chunkformer.config import Config, ConfigError, ModelConfig

# Model fields a warm-started run may change: attention layout, added token shifts, execution.
MAY_DIFFER = frozenset({"attention", "layer_pattern", "key_shift", "value_shift", "query_shift",
                        "dtype", "param_dtype", "remat"})
Path = state_lib.Path


@dataclasses.dataclass(frozen=True)
class Plan:
  source: str  # the source run directory
  loaded: frozenset[Path]  # parameter paths taken from the source
  new: frozenset[Path]  # parameter paths freshly initialised


def param_shapes(model: ModelConfig) -> dict[Path, tuple[int, ...]]:
  """Parameter path -> shape of ``model``, traced abstractly (nothing is computed)."""
  from chunkformer.model import Transformer  # lazy: model imports attention, config only

  tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
  boxed = jax.eval_shape(lambda r, t: Transformer(model).init(r, t)["params"],
                         jax.random.key(0), tokens)
  flat = traverse_util.flatten_dict(nn.meta.unbox(boxed))
  return {tuple(k): tuple(v.shape) for k, v in flat.items()}


def plan(config: Config) -> Plan:
  """Which parameters load and which are new (module docstring); ConfigError on a mismatch."""
  source = config.init.from_workdir
  try:
    source_config = workdir_lib.read_config(source)
  except ConfigError as e:
    raise ConfigError(f"config field 'init.from_workdir': {e}") from None
  for field in dataclasses.fields(ModelConfig):
    if field.name in MAY_DIFFER:
      continue
    old, new = getattr(source_config.model, field.name), getattr(config.model, field.name)
    if old != new:
      raise ConfigError(f"config field 'model.{field.name}': {new!r} differs from {old!r} of the "
                        f"init.from_workdir run {source!r}; only {', '.join(sorted(MAY_DIFFER))} "
                        "may change when starting from its weights")
  have, want = param_shapes(source_config.model), param_shapes(config.model)
  for path in sorted(have.keys() & want.keys()):
    if have[path] != want[path]:
      raise ConfigError(f"config field 'init.from_workdir': parameter {'/'.join(path)} has shape "
                        f"{have[path]} in {source!r} but {want[path]} in this model")
  dropped = sorted(have.keys() - want.keys())
  if dropped:
    raise ConfigError(f"config field 'init.from_workdir': this model has no parameter "
                      f"{'/'.join(dropped[0])} (shape {have[dropped[0]]}) of {source!r}"
                      f"{f' (and {len(dropped) - 1} more)' if len(dropped) > 1 else ''}; "
                      "its weights would be dropped")
  return Plan(source, frozenset(have.keys() & want.keys()), frozenset(want.keys() - have.keys()))


def load_into(config: Config, fresh: Any, source_params: Any, step: int) -> Any:
  """``fresh`` (a TrainState) with every parameter of ``plan(config)`` taken from
  ``source_params`` (the source run's step-``step`` parameters, ``runtime.restore_newest``)."""
  p = plan(config)
  source_flat = traverse_util.flatten_dict(source_params)
  flat = traverse_util.flatten_dict(fresh.params)
  for path in p.loaded:
    target = flat[path]
    flat[path] = jax.device_put(np.asarray(source_flat[path], target.dtype), target.sharding)
  from absl import logging

  logging.info("init.from_workdir: %d parameter arrays loaded from %s (step %d), %d new: %s",
               len(p.loaded), p.source, step, len(p.new),
               ", ".join(sorted("/".join(k) for k in p.new)) or "none")
  return fresh.replace(params=traverse_util.unflatten_dict(flat))


def train_only_new(inner: optax.GradientTransformation, steps: int,
                   new_paths: Callable[[], frozenset[Path]]) -> optax.GradientTransformation:
  """``inner``, except that for the first ``steps`` updates only ``new_paths()`` change.

  ``new_paths`` is called when the update is traced (training), never by ``init``, so that
  restoring a finished run for evaluation does not need the source run.
  """
  return state_lib.freeze_for(inner, steps, lambda path: path not in new_paths())


def optimizer(config: Config, inner: optax.GradientTransformation) -> optax.GradientTransformation:
  """``inner`` wrapped by ``train_only_new`` when ``init.train_only_new_steps`` asks for it."""
  if not config.init.train_only_new_steps:
    return inner
  return train_only_new(inner, config.init.train_only_new_steps,
                        functools.cache(lambda: plan(config).new))
