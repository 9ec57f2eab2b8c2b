"""A finished training run restored for evaluation, and batched greedy prediction over rows.

The sweeps read a run directory written by ``chunkformer.trainer.train``: its recorded config
(``DIR/config.json``) and its newest checkpoint. Only a finished run is evaluated (the newest
checkpoint holds ``train.steps`` updates); anything else is a ConfigError naming the directory,
raised before a model is built. Single process: the sweeps are evaluation tools, the rows are
made on this host and split over its devices along the mesh's batch axes.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from chunkformer import checkpointing, heldout, objective
from chunkformer import data as data_lib
from chunkformer import runtime as runtime_lib
from chunkformer import sharding as sharding_lib
from chunkformer import workdir as workdir_lib
from chunkformer.config import Config, ConfigError

# Sown diagnostics (``self.sow("intermediates", name, value)``) that extract functions read.
INTERMEDIATES = "intermediates"
ROW_KEYS = ("inputs", "positions", "segment_ids")

# (collections, {"inputs", "positions", "segment_ids"} [B, T]) -> dict of arrays with a leading
# batch axis B; runs inside the jitted forward pass. ``collections`` holds what the model sowed:
# "intermediates" (and captured outputs), "aux_loss", "aux_metrics".
Extract = Callable[[Any, dict[str, jax.Array]], dict[str, jax.Array]]
# Flax ``capture_intermediates`` filter: (module, method name) -> whether to store its output.
Capture = Callable[[Any, str], bool]


@dataclasses.dataclass(frozen=True)
class TrainedModel:
  workdir: str
  config: Config
  runtime: runtime_lib.Runtime
  params: Any
  step: int


def heldout_rows(config: Config, count: int, first_step: int = 0) -> dict[str, np.ndarray]:
  """``count`` held-out rows of ``config``'s data: its held-out batches ``first_step``,
  ``first_step + 1``, ... concatenated and cut (every key of the batch)."""
  batches, have, step = [], 0, first_step
  while have < count:
    batch = data_lib.make_batch(config.data, seed=config.seed, step=step, split="heldout")
    batches.append(batch)
    have += batch["inputs"].shape[0]
    step += 1
  return {k: np.concatenate([b[k] for b in batches])[:count] for k in batches[0]}


def finished_config(workdir: str) -> Config:
  """The config of the finished run in ``workdir``, checked without restoring anything.

  Raises ConfigError naming the directory if it holds no run, no checkpoint, or only
  checkpoints before the run's last step (an unfinished run).
  """
  config = workdir_lib.read_config(workdir)
  if not os.path.isdir(os.path.join(workdir, "checkpoints")):
    raise ConfigError(f"workdir {workdir!r} holds no checkpoints; train it first")
  checkpointer = checkpointing.Checkpointer(workdir, config.train, read_only=True)
  try:
    steps = checkpointer.steps()
  finally:
    checkpointer.close()
  if not steps:
    raise ConfigError(f"workdir {workdir!r} holds no checkpoint; train it first")
  if steps[-1] < config.train.steps:
    raise ConfigError(f"workdir {workdir!r} holds an unfinished run: latest checkpoint at step "
                      f"{steps[-1]} of {config.train.steps}; rerun its training to finish it")
  return config


def load(workdir: str) -> TrainedModel:
  """Restores the finished run in ``workdir`` (see ``finished_config`` for the errors)."""
  finished_config(workdir)  # the cheap checks first: nothing is built for a refused run
  config, rt, params, step = heldout.restore_run(workdir)
  return TrainedModel(workdir, config, rt, params, step)


class Predictor:
  """Greedy next-token predictions (and sown diagnostics) of a trained model over many rows.

  ``predictor(rows)`` takes [N, T] numpy arrays ``inputs``, ``positions``, ``segment_ids``,
  runs them through one jitted forward pass in batches of ``batch_size`` rows (the last batch
  padded by repeating a row), and returns ``{"predictions": int32 [N, T], **extract(...)}`` as
  numpy arrays with N rows. Training-only behaviour (random chunk phases) is off.
  """

  def __init__(self, trained: TrainedModel, batch_size: int, extract: Extract | None = None,
               capture: Capture | None = None):
    rt = trained.runtime
    sharding_lib.check_batch(batch_size, rt.batch_sharding, field="sweep.eval_batch_size")
    self.trained, self.batch_size = trained, batch_size
    collections = objective.AUX_COLLECTIONS + (INTERMEDIATES,)

    def forward(params, inputs_BxT, positions_BxT, segment_ids_BxT):
      logits_BxTxV, state = rt.model.apply(
          {"params": params}, inputs_BxT, positions_BxT, segment_ids_BxT, train=False,
          mutable=collections, capture_intermediates=capture or False)
      out = {"predictions": jnp.argmax(logits_BxTxV, axis=-1).astype(jnp.int32)}
      if extract is not None:
        rows = dict(zip(ROW_KEYS, (inputs_BxT, positions_BxT, segment_ids_BxT), strict=True))
        out.update(extract(state, rows))
      return out

    self._forward = jax.jit(forward)

  def __call__(self, rows: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    rt = self.trained.runtime
    num_rows = rows["inputs"].shape[0]
    if num_rows == 0:
      raise ValueError("no rows to predict")
    if rows["inputs"].shape[1] != self.trained.config.data.seq_len:
      raise ValueError(f"rows have {rows['inputs'].shape[1]} tokens; the model was trained on "
                       f"data.seq_len = {self.trained.config.data.seq_len}")
    pieces: list[dict[str, np.ndarray]] = []
    with rt.context():
      for start in range(0, num_rows, self.batch_size):
        index = np.minimum(np.arange(start, start + self.batch_size), num_rows - 1)
        batch = [jax.device_put(np.asarray(rows[key][index], np.int32), rt.batch_sharding)
                 for key in ROW_KEYS]
        out = jax.device_get(self._forward(self.trained.params, *batch))
        keep = min(self.batch_size, num_rows - start)
        pieces.append({k: np.asarray(v)[:keep] for k, v in out.items()})
    return {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]}
