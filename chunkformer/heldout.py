"""Held-out evaluation: during training, and of a finished run's checkpoint.

Held-out batch ``i`` is step ``i`` of the ``heldout`` split, so every evaluation of a run (and
of different runs with the same data config) scores the same rows.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from absl import logging

from chunkformer import objective
from chunkformer import runtime as runtime_lib
from chunkformer import workdir as workdir_lib
from chunkformer.config import Config, ConfigError

EvalStep = Callable[[Any, dict[str, jax.Array]], dict[str, jax.Array]]


def make_eval_step(rt: runtime_lib.Runtime) -> EvalStep:
  """params, batch -> additive metric sums (replicated), deterministic (train=False)."""
  def eval_step(params, batch):
    _, sums = objective.loss_fn(params, rt.model, batch, None, train=False)
    return sums

  return jax.jit(eval_step,
                 in_shardings=(rt.state_shardings.params, rt.batch_sharding),
                 out_shardings=jax.sharding.NamedSharding(rt.mesh, jax.sharding.PartitionSpec()))


def heldout_metrics(rt: runtime_lib.Runtime, eval_step: EvalStep, params: Any,
                    num_batches: int) -> dict[str, float]:
  """Means (loss, accuracy, near/far accuracy) over held-out batches 0..num_batches-1."""
  with rt.context():
    sums = [eval_step(params, rt.batch("heldout", i)) for i in range(num_batches)]
  host = jax.device_get(sums)
  total = {k: float(np.sum([s[k] for s in host], dtype=np.float64)) for k in host[0]}
  return objective.summarize(total)


def restore_run(workdir: str, allow_unfinished: bool = False
                ) -> tuple[Config, runtime_lib.Runtime, Any, int]:
  """``(config, runtime, params, step)`` of the newest checkpoint that restores in ``workdir``
  (its recorded config): the one restore path of eval.py and ``evaluation.trained.load``.

  Raises ConfigError naming the directory if it holds no run, no checkpoint that loads, or
  (unless ``allow_unfinished``) only checkpoints before the run's last step.
  """
  config = workdir_lib.read_config(workdir)
  if not os.path.isdir(os.path.join(workdir, "checkpoints")):
    raise ConfigError(f"workdir {workdir!r} holds no checkpoints; train it first")
  _, rt, params, step = runtime_lib.restore_newest(workdir)
  if step < config.train.steps:
    if not allow_unfinished:
      raise ConfigError(f"workdir {workdir!r} holds an unfinished run: the newest checkpoint "
                        f"that restores is at step {step} of {config.train.steps}")
    logging.warning("workdir %s: evaluating step %d of %d (run not finished)", workdir, step,
                    config.train.steps)
  return config, rt, params, step


def evaluate_checkpoint(workdir: str, num_batches: int | None = None,
                        allow_unfinished: bool = False) -> dict[str, Any]:
  """Held-out metrics of the latest checkpoint in ``workdir`` (its recorded config).

  Errors as ``restore_run``, and ``run_lock.Locked`` if another process holds the run (is
  training it): a finished run is read under its lock, so no checkpoint is written or deleted
  under the reader. ``allow_unfinished`` reads without the lock, the newest checkpoint of a run
  another process may still be training.
  """
  workdir_lib.read_config(workdir)  # not a run (e.g. a sweep): refused before any lock file
  lock = (contextlib.nullcontext() if allow_unfinished else workdir_lib.locked(
      workdir, "evaluation", reader=True,
      advice="wait for it to finish, or pass --allow_unfinished to evaluate its newest "
             "checkpoint now"))
  with lock:
    config, rt, params, step = restore_run(workdir, allow_unfinished)
    num_batches = num_batches or config.train.eval_batches
    metrics = heldout_metrics(rt, make_eval_step(rt), params, num_batches)
  return {"workdir": workdir, "step": step, "finished": step >= config.train.steps,
          "eval_batches": num_batches, "heldout": metrics}
