"""The periodic signature of ordinary language modelling: held-out loss by position mod M.

A model with fixed chunks of M tokens sees a token's recent past differently at each phase of
the chunk grid (at phase M - 1 the chunk is about to close; right after, its entry is new), so
its next-token loss may depend on the absolute position ``t mod M`` even on plain text; full
attention has no grid and should show none, a content-defined router neither in absolute
position. Measured on held-out batches 0..B-1 of the run's own data (the batches its training
reported), over the CODE targets only: the scored targets minus the planted needles' answer
bytes where the rows carry needles, so the answers (a retrieval, analysed by the prefix probe)
do not weigh on the language-model reading. Position = column in the row (0..T-1), which is
the grid the fixed kind chunks.

Per held-out batch and phase the summed loss (nats) and token count are kept; bits per byte is
summed loss / ln 2 / predicted bytes (UTF-8 bytes of the targets: ``target_bytes`` on corpus
batches, 1 per byte token otherwise; ``token_bytes``).

Raw phase means carry the loss's fall over the first positions of a row (position 0 has no
context: its loss alone lifts phase 0's mean by about (loss_0 - mean) / (T / M)). The
*signature* (``Rows.signature``) is therefore ``loss_phase.loss_by_phase`` of the per-token
rows: the per-position curve detrended by a one-period moving average, the excess loss per
phase with row-bootstrap intervals, its amplitude and a permutation p-value. The rows
(``Rows``: loss, code mask and bytes per target, [N, T]) are stored beside results.json as
``DIR/lm_loss/<unit>.npz`` (``records.loss_rows``), so the signature, seed pooling and paired
comparisons between models scored on the same rows can be recomputed from DIR alone.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from chunkformer import objective
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.probes.base import ProbeContext, ProbeResult
from chunkformer.evaluation.records.loss_rows import Rows, stack

BYTE_TOKENS = 256  # byte-level tasks: ids below this are one byte each
def group_by_phase(values_NxT: np.ndarray, mask_NxT: np.ndarray,
                   period: int) -> tuple[np.ndarray, np.ndarray]:
  """(sum of ``values`` where ``mask``, mask sum) per column mod ``period``: two [period] arrays."""
  if values_NxT.shape != mask_NxT.shape or values_NxT.ndim != 2:
    raise ValueError(f"values {values_NxT.shape} and mask {mask_NxT.shape} must be equal [N, T]")
  if period < 1:
    raise ValueError(f"period must be >= 1, got {period}")
  phase_T = np.arange(values_NxT.shape[1]) % period
  weighted_T = (np.asarray(values_NxT, np.float64) * mask_NxT).sum(axis=0)
  counts_T = np.asarray(mask_NxT, np.float64).sum(axis=0)
  return (np.bincount(phase_T, weighted_T, minlength=period),
          np.bincount(phase_T, counts_T, minlength=period))


@dataclasses.dataclass(frozen=True)
class PhaseLoss:
  """Held-out code-token loss of one model, by batch and position mod ``period``.

  Everything is derived from ``rows`` (batch b is rows ``b * rows_per_batch`` onwards), so the
  sums reported here and the signature read the same stored values.
  """

  period: int
  rows: Rows
  rows_per_batch: int

  def __post_init__(self):
    n = self.rows.loss_NxT.shape[0]
    if self.rows_per_batch < 1 or n % self.rows_per_batch:
      raise ValueError(f"{n} rows do not split into batches of rows_per_batch="
                       f"{self.rows_per_batch}")

  @property
  def seq_len(self) -> int:
    return self.rows.loss_NxT.shape[1]

  def _batches(self, values_NxT: np.ndarray) -> list[np.ndarray]:
    return np.split(np.asarray(values_NxT), len(values_NxT) // self.rows_per_batch)

  @functools.cached_property
  def _sums_and_counts(self) -> tuple[np.ndarray, np.ndarray]:
    grouped = [group_by_phase(loss, mask, self.period) for loss, mask in
               zip(self._batches(self.rows.loss_NxT), self._batches(self.rows.mask_NxT),
                   strict=True)]
    return np.stack([g[0] for g in grouped]), np.stack([g[1] for g in grouped])

  @property
  def loss_sum_BxP(self) -> np.ndarray:
    """Nats summed per held-out batch and phase."""
    return self._sums_and_counts[0]

  @property
  def count_BxP(self) -> np.ndarray:
    """Scored code tokens per batch and phase."""
    return self._sums_and_counts[1]

  @property
  def bytes_B(self) -> np.ndarray:
    """UTF-8 bytes those tokens predict, per batch."""
    return np.array([float(b.sum()) for b in
                     self._batches(self.rows.bytes_NxT * self.rows.mask_NxT)])

  @property
  def mean_loss_BxP(self) -> np.ndarray:
    return self.loss_sum_BxP / np.maximum(self.count_BxP, 1.0)

  @property
  def mean_loss_P(self) -> np.ndarray:
    return self.loss_sum_BxP.sum(axis=0) / np.maximum(self.count_BxP.sum(axis=0), 1.0)

  @property
  def loss(self) -> float:
    return float(self.loss_sum_BxP.sum() / max(self.count_BxP.sum(), 1.0))

  @property
  def bits_per_byte(self) -> float:
    return float(self.loss_sum_BxP.sum() / max(self.bytes_B.sum(), 1.0) / math.log(2.0))

  def as_record(self) -> dict[str, Any]:
    """JSON-ready: pooled and per-batch arrays ([batch][phase]) for intervals and tests."""
    mean_p = self.mean_loss_P
    return {
        "period": self.period,
        "tokens": "code targets (scored, needle answers excluded)",
        "position": "column in the row mod period",
        "batches": int(self.loss_sum_BxP.shape[0]),
        "rows_per_batch": self.rows_per_batch,
        "seq_len": self.seq_len,
        "loss": self.loss,
        "bits_per_byte": self.bits_per_byte,
        "mean_loss_by_phase": mean_p.tolist(),
        "count_by_phase": self.count_BxP.sum(axis=0).tolist(),
        "phase_spread": float(mean_p.max() - mean_p.min()),  # nats, largest minus smallest
        "mean_loss_by_batch_and_phase": self.mean_loss_BxP.tolist(),
        "loss_sum_by_batch_and_phase": self.loss_sum_BxP.tolist(),
        "count_by_batch_and_phase": self.count_BxP.tolist(),
        "bits_per_byte_by_batch": (self.loss_sum_BxP.sum(axis=1) / np.maximum(self.bytes_B, 1.0)
                                   / math.log(2.0)).tolist(),
    }


def code_mask(batch: dict[str, np.ndarray]) -> np.ndarray:
  """Scored targets minus needle answers (float [B, T])."""
  mask = np.asarray(batch["loss_mask"], np.float64)
  for key in ("near_mask", "far_mask"):
    if key in batch:
      mask = mask - np.asarray(batch[key], np.float64)
  return mask


def token_bytes(batch: dict[str, np.ndarray]) -> np.ndarray:
  """UTF-8 bytes each target predicts (float [B, T])."""
  if "target_bytes" in batch:
    return np.asarray(batch["target_bytes"], np.float64)
  return (np.asarray(batch["targets"]) < BYTE_TOKENS).astype(np.float64)


def measure(trained: trained_lib.TrainedModel, num_batches: int, period: int) -> PhaseLoss:
  """Per-token loss of held-out batches 0..num_batches-1, grouped (module docstring)."""
  if num_batches < 1:
    raise ValueError(f"num_batches must be >= 1, got {num_batches}")
  rt = trained.runtime

  @jax.jit
  def token_loss(params, batch):
    logits_BxTxV, _ = objective.forward(rt.model, params, batch, train=False)
    return optax.softmax_cross_entropy_with_integer_labels(
        logits_BxTxV.astype(jnp.float32), batch["targets"])

  rows = []
  with rt.context():
    for i in range(num_batches):
      batch = rt.batch("heldout", i)
      host = {k: np.asarray(jax.device_get(v)) for k, v in batch.items()}
      mask = code_mask(host)
      # float32 as stored (``save``), zero off the mask: the sums and the signature are
      # computed from exactly the stored values.
      loss_BxT = np.where(mask > 0, np.asarray(jax.device_get(token_loss(trained.params, batch)),
                                               np.float32), np.float32(0))
      rows.append(Rows(loss_BxT, mask, token_bytes(host)))
  return PhaseLoss(period, stack(rows), rows_per_batch=len(rows[0].loss_NxT))


def probe(context: ProbeContext, batches: int = 16) -> ProbeResult:
  """The ``lm_phase_loss`` entry (module docstring): ``batches`` held-out batches, phases read
  at the model's own M."""
  if context.unit_config.data.task in ("kv", "lookup"):  # retrieval rows: a few scored tokens
    return ProbeResult(fields={})
  period = context.chunk_sizes[0]
  measured = measure(context.trained, batches, period)
  signature = measured.rows.signature(period, **context.analyze_kw)
  return ProbeResult(fields={"lm_phase_loss": {**measured.as_record(), "signature": signature}},
                     loss_rows=measured.rows)
