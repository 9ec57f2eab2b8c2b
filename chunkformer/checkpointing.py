"""Checkpoints (Orbax ``CheckpointManager``) and preemption.

Checkpoint ``k`` holds the state after ``k`` updates, so a resumed run continues at step ``k``
and, because batches and the per-step rng are functions of the step, reproduces the
uninterrupted run exactly. Orbax writes each save into a temporary directory and renames it
when complete, so a process killed mid-save leaves the previous checkpoints intact; leftover
temporary directories (``*.orbax-checkpoint-tmp*``) are removed when the manager opens. That is
safe only because training holds the run lock (``run_lock``) first: a second process opening
the manager would delete the first one's save in progress.

A checkpoint holds the TrainState as Orbax's single item (``default``). Runs on task "corpus"
(``Checkpointer(..., with_data=True)``) add the items ``data`` (the training iterator's Grain
state, written by ``grain.checkpoint``, one JSON file per process) and ``dataset`` (the shards'
directory and tokenizer hash, checked when resuming); the state stays in ``default``, so a
plain ``StandardRestore`` reader (evaluation) loads either kind.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging
from jax.experimental import multihost_utils

from chunkformer.config import TrainConfig

ITEMS = ("default", "data", "dataset")


class Checkpointer:
  """Async saves every ``train.checkpoint_every`` steps into ``DIR/checkpoints``, keeps the last
  ``train.keep_checkpoints``, and restores the newest one that loads.

  Orbax's default policy also saves after the first step of a fresh run (step 1), so that a
  crash soon after compilation loses nothing.
  """

  def __init__(self, workdir: str, train: TrainConfig, read_only: bool = False,
               with_data: bool = False):
    self.read_only, self.with_data = read_only, with_data
    self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    if read_only:
      options = ocp.CheckpointManagerOptions(read_only=True, create=False,
                                             save_interval_steps=0)
    else:
      options = ocp.CheckpointManagerOptions(
          save_interval_steps=train.checkpoint_every,
          max_to_keep=train.keep_checkpoints,
          enable_async_checkpointing=True,
          cleanup_tmp_directories=True,
      )
    self.manager = ocp.CheckpointManager(self.directory, options=options,
                                         item_names=ITEMS if with_data else None)

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def save(self, step: int, state: Any, force: bool = False, data: Any = None) -> bool:
    """Starts an async save if ``step`` is due (or ``force``); returns whether one started.

    ``data`` (a ``data.feed.CorpusFeed``, with_data only) adds its iterator state, captured now,
    before the call returns (Grain's handler is synchronous), and its dataset record.
    """
    if not self.with_data:
      return self.manager.save(step, args=ocp.args.StandardSave(state), force=force)
    items = {"default": ocp.args.StandardSave(state)}
    if data is not None:
      import grain  # noqa: PLC0415 -- only runs on task corpus need it

      items["data"] = grain.checkpoint.CheckpointSave(data.train_iterator)
      items["dataset"] = ocp.args.JsonSave(data.info())
    return self.manager.save(step, args=ocp.args.Composite(**items), force=force)

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def restore_latest(self, abstract: Any, data: Any = None) -> tuple[Any, int] | None:
    """(state, step) from the newest checkpoint that restores into ``abstract``; None if none.

    With ``data`` (a ``data.feed.CorpusFeed``) its iterator is set to the checkpoint's state and
    ``data.resumed`` checks the recorded dataset (raises on a different tokenizer hash).

    ``abstract`` is a tree of ``jax.ShapeDtypeStruct`` with shardings, so arrays load straight
    into their shards. A checkpoint that fails to load is reported (directory and step), moved
    into ``DIR/broken_checkpoints/`` (kept for inspection, and out of the way of the re-save of
    that step), and the next older one is tried.
    """
    broken = []
    result = None
    items = {"default": ocp.args.StandardRestore(abstract)}
    if self.with_data and data is not None:
      import grain  # noqa: PLC0415 -- only runs on task corpus need it

      items["data"] = grain.checkpoint.CheckpointRestore(data.train_iterator)
      items["dataset"] = ocp.args.JsonRestore()
    restored = None
    for step in reversed(self.steps()):
      try:
        if self.with_data:
          restored = self.manager.restore(step, args=ocp.args.Composite(**items))
          result = restored["default"], step
        else:
          result = self.manager.restore(step, args=items["default"]), step
        break
      except Exception as e:  # noqa: BLE001 -- any failure means "try the previous one"
        logging.error("checkpoint %s at step %d failed to restore (%s: %s); falling back to "
                      "the previous checkpoint", self.directory, step, type(e).__name__, e)
        broken.append(step)
    if broken and not self.read_only:
      self._move_aside(broken)
    if result is not None and self.with_data and data is not None:
      data.resumed(result[1], restored["dataset"])
    return result

  def _move_aside(self, steps: list[int]) -> None:
    if jax.process_index() == 0:
      target = os.path.join(os.path.dirname(self.directory), "broken_checkpoints")
      os.makedirs(target, exist_ok=True)
      for step in steps:
        name = str(step)  # Orbax's step directory name without a step_prefix
        destination = os.path.join(target, f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(os.path.join(self.directory, name), destination)
        logging.warning("moved unrestorable checkpoint %s to %s", name, destination)
    multihost_utils.sync_global_devices("chunkformer_broken_checkpoints")
    self.manager.reload()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


class PreemptionWatch:
  """Tells the loop when to save and stop because the job is being preempted (SIGTERM).

  Single process: a SIGTERM handler sets a flag. Several processes: JAX's preemption service
  (started by ``jax.distributed.initialize``) catches SIGTERM on any process and agrees on a
  common step for all of them, which Orbax exposes as ``reached_preemption``.
  """

  def __init__(self, checkpointer: Checkpointer):
    self._checkpointer = checkpointer
    self._flag = threading.Event()
    self._previous = None
    if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

  def _on_sigterm(self, signum, frame) -> None:
    del signum, frame
    logging.warning("SIGTERM received: saving a checkpoint and stopping")
    self._flag.set()

  def reached(self, step: int) -> bool:
    if jax.process_count() > 1:
      return self._checkpointer.manager.reached_preemption(step)
    return self._flag.is_set()

  def close(self) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None


def restore_latest_read_only(workdir: str, train: TrainConfig, abstract_state: Any):
  """(state, step) of the newest checkpoint in ``workdir`` that restores, or None; writes nothing.

  For evaluation and analysis of a run that another process may still own.
  """
  checkpointer = Checkpointer(workdir, train, read_only=True)
  try:
    return checkpointer.restore_latest(abstract_state)
  finally:
    checkpointer.close()
