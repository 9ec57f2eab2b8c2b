"""The training loop: ``train(config, workdir)``.

The device never waits on the host: step ``s`` is dispatched before the metrics of step
``s - 1`` are fetched, and the host syncs only to log, evaluate, and before a checkpoint
(whose state must follow a finite loss). Rerunning the same command resumes from the newest
checkpoint and reproduces the uninterrupted run, because batches and the per-step rng are
functions of the step (task "corpus": the Grain iterator's state is saved in the checkpoint).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import optax
from absl import logging
from tensorboardX import SummaryWriter

from chunkformer import accumulate, checkpointing, objective, warm_start
from chunkformer import flops as flops_lib
from chunkformer import heldout as heldout_lib
from chunkformer import runtime as runtime_lib
from chunkformer import train_state as state_lib
from chunkformer import workdir as workdir_lib
from chunkformer.config import Config


@dataclasses.dataclass(frozen=True)
class Progress:
  """What a progress hook sees (after each log line and each evaluation)."""

  step: int  # updates applied so far
  total_steps: int
  split: str  # "train" or "heldout"
  metrics: dict[str, float]
  steps_per_sec: float
  eta_s: float  # estimated seconds to the last step at the recent rate


ProgressHook = Callable[[Progress], None]


def make_train_step(rt: runtime_lib.Runtime):
  """Jitted (state, batch) -> (state, metric sums, stats); the input state is donated."""
  phase_root = rt.phase_root()
  schedule = state_lib.learning_rate_schedule(rt.config.train)

  def train_step(state: state_lib.TrainState, batch):
    rng = jax.random.fold_in(phase_root, state.step)
    grads, sums = accumulate.grads_and_sums(state.params, rt.model, batch, rng,
                                            rt.config.train.grad_accum_steps)
    updates, opt_state = rt.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    stats = {"grad_norm": optax.global_norm(grads), "learning_rate": schedule(state.step)}
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), sums, stats

  replicated = jax.sharding.NamedSharding(rt.mesh, jax.sharding.PartitionSpec())
  return jax.jit(train_step, in_shardings=(rt.state_shardings, rt.batch_sharding),
                 out_shardings=(rt.state_shardings, replicated, replicated), donate_argnums=0)


class _Window:
  """Host-side sums of the steps since the last log line, and their wall time."""

  def __init__(self, step: int):
    self.reset(step)

  def reset(self, step: int) -> None:
    self.sums: dict[str, float] = {}
    self.stats: dict[str, float] = {}
    self.first, self.start = step, time.perf_counter()

  def add(self, sums: dict[str, Any], stats: dict[str, Any]) -> None:
    for k, v in sums.items():
      self.sums[k] = self.sums.get(k, 0.0) + float(v)
    self.stats = {k: float(v) for k, v in stats.items()}


class _Logger:
  """Console lines, TensorBoard events and the progress hook, all on process 0 only."""

  def __init__(self, workdir: str, total_steps: int, tokens_per_step: int,
               hook: ProgressHook | None, peak_fn: Callable[[], float], flops_per_token: float):
    self.total, self.tokens_per_step, self.hook = total_steps, tokens_per_step, hook
    self.peak_fn, self.flops_per_token = peak_fn, flops_per_token  # peak FLOP/s of the mesh
    self.primary = jax.process_index() == 0
    self.writer = SummaryWriter(workdir) if self.primary else None
    self.rate = math.nan

  def train(self, step: int, window: _Window) -> None:
    elapsed = time.perf_counter() - window.start
    self.rate = (step - window.first) / max(elapsed, 1e-9)
    metrics = objective.summarize(window.sums)
    eta = (self.total - step) / self.rate if self.rate > 0 else math.inf
    far = metrics.get("far_accuracy")
    tokens_per_sec = self.rate * self.tokens_per_step
    mfu = self.flops_per_token * tokens_per_sec / self.peak_fn()
    if self.primary:
      logging.info(
          "step %d/%d  loss %.4f  acc %.4f%s  grad_norm %.3g  lr %.3g  %.2f steps/s  "
          "%.0f tokens/s  MFU %.1f%%  ETA %s", step, self.total, metrics["loss"],
          metrics["accuracy"], "" if far is None else f"  far_acc {far:.4f}",
          window.stats["grad_norm"], window.stats["learning_rate"], self.rate, tokens_per_sec,
          100 * mfu, format_duration(eta))
    scalars = dict(metrics, **window.stats, steps_per_sec=self.rate,
                   tokens_per_sec=tokens_per_sec, mfu=mfu)
    self._emit(step, "train", metrics, scalars, eta)

  def heldout(self, step: int, metrics: dict[str, float]) -> None:
    if self.primary:
      logging.info("step %d/%d  held-out  %s", step, self.total,
                   "  ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    eta = (self.total - step) / self.rate if self.rate > 0 else math.nan
    self._emit(step, "heldout", metrics, metrics, eta)

  def _emit(self, step, split, metrics, scalars, eta) -> None:
    if self.writer is not None:
      for k, v in scalars.items():
        self.writer.add_scalar(f"{split}/{k}", v, step)
      self.writer.flush()
    if self.hook is not None and self.primary:
      self.hook(Progress(step, self.total, split, metrics,
                         0.0 if math.isnan(self.rate) else self.rate, eta))

  def close(self) -> None:
    if self.writer is not None:
      self.writer.close()


def format_duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  m, s = divmod(int(seconds), 60)
  return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m{s:02d}s"


def _check_finite(step: int, sums: dict[str, Any], stats: dict[str, Any]) -> None:
  loss = float(sums["loss_sum"]) / max(float(sums["count"]), 1.0)
  grad_norm = float(stats["grad_norm"])
  if not (math.isfinite(loss) and math.isfinite(grad_norm)):
    raise FloatingPointError(
        f"non-finite training loss or gradient at step {step} (loss {loss}, gradient norm "
        f"{grad_norm}); stopped before a checkpoint of this state was written")


def train(config: Config, workdir: str, *, overwrite: bool = False,
          progress: ProgressHook | None = None,
          devices: Sequence[jax.Device] | None = None) -> dict[str, Any]:
  """Trains ``config`` in ``workdir`` (resuming if it holds this run); returns final metrics.

  Returns ``{"step", "heldout": {...}}`` (also written to ``DIR/final_metrics.json``), or
  ``{"step", "preempted": True}`` when SIGTERM stopped the run after saving a checkpoint.
  ``devices`` defaults to every device of every process. Raises ConfigError (before compiling)
  on bad input, ``run_lock.Locked`` (before writing) if another process holds ``workdir``,
  FloatingPointError naming the step on a non-finite loss or gradient.
  """
  workdir_lib.require_directory(workdir)  # before building anything
  rt = runtime_lib.build(config, devices)
  if config.init.from_workdir:  # refuses a mismatched source before the workdir is claimed
    warm_start.plan(config)
  # Locked before anything is written: a second process on DIR stops here, in one line.
  with workdir_lib.locked(workdir, "training"):
    return _train(config, workdir, rt, overwrite, progress)


def _train(config: Config, workdir: str, rt: runtime_lib.Runtime, overwrite: bool,
           progress: ProgressHook | None) -> dict[str, Any]:
  workdir_lib.prepare(workdir, config, overwrite)
  checkpointer = checkpointing.Checkpointer(workdir, config.train, with_data=rt.feed is not None)
  restored = checkpointer.restore_latest(rt.abstract_state, data=rt.feed)
  if restored is None:
    state, start = rt.init_state(), 0
  else:
    state, start = restored
    logging.info("resuming %s from step %d", workdir, start)
  logging.info("model: %d parameters, mesh %s, %d steps of %d tokens",
               state_lib.param_count(state.params), dict(rt.mesh.shape), config.train.steps,
               rt.tokens_per_step)
  train_step, eval_step = make_train_step(rt), heldout_lib.make_eval_step(rt)
  flops_per_token = flops_lib.train_flops_per_token(config.model, config.data.seq_len)

  def mesh_peak() -> float:  # on CPU measured anew at each log line (outside the timed window)
    return flops_lib.peak_flops_per_device(rt.mesh.devices.flat[0],
                                           config.train.peak_tflops)[0] * rt.mesh.devices.size

  peak, source = flops_lib.peak_flops_per_device(rt.mesh.devices.flat[0], config.train.peak_tflops)
  logging.info("model FLOPs: %.4g per training token; peak %.4g FLOP/s per device (%s) x %d",
               flops_per_token, peak, source, rt.mesh.devices.size)
  logger = _Logger(workdir, config.train.steps, rt.tokens_per_step, progress, mesh_peak,
                   flops_per_token)
  watch = checkpointing.PreemptionWatch(checkpointer)
  total, window, pending = config.train.steps, _Window(start), None

  def flush() -> None:
    # Fetches the pending step's metrics: the only place the host waits for the device.
    nonlocal pending
    if pending is None:
      return
    step, sums, stats = jax.device_get(pending)
    pending = None
    _check_finite(step, sums, stats)
    window.add(sums, stats)
    if (step + 1) % config.train.log_every == 0 or step + 1 == total:
      logger.train(step + 1, window)
      window.reset(step + 1)

  try:
    with rt.context():
      if start < total:
        began = time.perf_counter()
        # Lowered on a held-out batch (same structure and shardings): reading a training
        # batch here would advance a corpus feed's iterator past the step it must resume at.
        train_step = train_step.lower(state, rt.batch("heldout", 0)).compile()
        logging.info("compiled the train step in %.1f s", time.perf_counter() - began)
      for step in range(start, total):
        if watch.reached(step):
          flush()
          if checkpointer.manager.latest_step() != step:  # not already saved by the interval
            checkpointer.save(step, state, force=True, data=rt.feed)
          checkpointer.wait()
          logging.warning("preempted: checkpoint saved at step %d in %s", step,
                          checkpointer.directory)
          return {"step": step, "preempted": True}
        state, sums, stats = train_step(state, rt.batch("train", step))
        flush()
        pending = (step, sums, stats)
        done = step + 1
        if done == total or checkpointer.manager.should_save(done):
          flush()
          checkpointer.save(done, state, force=done == total, data=rt.feed)
        if done % config.train.eval_every == 0 and done != total:
          flush()
          began = time.perf_counter()
          logger.heldout(done, heldout_lib.heldout_metrics(rt, eval_step, state.params,
                                                        config.train.eval_batches))
          window.start += time.perf_counter() - began  # not training throughput
      flush()
    heldout = heldout_lib.heldout_metrics(rt, eval_step, state.params, config.train.eval_batches)
    logger.heldout(total, heldout)
    final = {"step": total, "heldout": heldout}
    workdir_lib.write_json(workdir, workdir_lib.FINAL_METRICS_FILE, final)
    return final
  finally:
    watch.close()
    logger.close()
    checkpointer.close()
    if rt.feed is not None:
      rt.feed.close()
