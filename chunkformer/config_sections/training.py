"""How a run trains (``train``: optimisation and bookkeeping) and where its parameters start
(``init``: warm start from another run)."""

from __future__ import annotations

import dataclasses

from chunkformer.config_sections.errors import require, require_positive


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Optimisation and bookkeeping. Counts in steps unless stated."""

  steps: int = 1000
  learning_rate: float = 1e-3  # peak, after linear warmup
  warmup_steps: int = 100
  min_lr_ratio: float = 0.1  # cosine decays to learning_rate * min_lr_ratio
  weight_decay: float = 0.01
  grad_clip: float = 1.0  # global-norm clip
  b1: float = 0.9
  b2: float = 0.95
  log_every: int = 50
  eval_every: int = 200
  eval_batches: int = 4  # held-out batches per evaluation
  checkpoint_every: int = 200
  keep_checkpoints: int = 3
  grad_accum_steps: int = 1  # micro-batches per update; data.batch_size is the whole update
  peak_tflops: float = 0.0  # per-device peak for MFU; 0 = device table (chunkformer/flops.py)
  # A curriculum for model.key_shift: the first N updates hold every token-shift weight at its
  # zero init, so the model first learns without the shift's shortcut (0 = off).
  shift_frozen_steps: int = 0

  def validate(self) -> None:
    require(self.steps >= 0, "train.steps", f"must be >= 0, got {self.steps}")
    require(self.learning_rate > 0, "train.learning_rate", "must be > 0")
    require(0 <= self.warmup_steps, "train.warmup_steps", "must be >= 0")
    require(0.0 <= self.min_lr_ratio <= 1.0, "train.min_lr_ratio", "must lie in [0, 1]")
    require_positive(self, ("log_every", "eval_every", "eval_batches", "checkpoint_every",
                            "keep_checkpoints", "grad_accum_steps"), "train")
    require(self.peak_tflops >= 0, "train.peak_tflops", "must be >= 0 (0 = device table)")
    require(0 <= self.shift_frozen_steps, "train.shift_frozen_steps", "must be >= 0 (0 = off)")
    require(not self.shift_frozen_steps or self.shift_frozen_steps < self.steps,
            "train.shift_frozen_steps", f"{self.shift_frozen_steps} must be below train.steps="
            f"{self.steps}, or the shift never trains")


@dataclasses.dataclass(frozen=True)
class InitConfig:
  """Where a fresh run's parameters come from (chunkformer/warm_start.py)."""

  from_workdir: str = ""  # run directory (e.g. an imported Qwen3) whose newest checkpoint's
  # params start this run; weights the new config adds (compressors) are freshly initialised
  train_only_new_steps: int = 0  # the first N updates train only the newly initialised weights

  def validate(self) -> None:
    require(self.train_only_new_steps >= 0, "init.train_only_new_steps", "must be >= 0")
    require(bool(self.from_workdir) or not self.train_only_new_steps,
            "init.train_only_new_steps", "needs init.from_workdir (no weights are new otherwise)")
