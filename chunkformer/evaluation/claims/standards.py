"""The standards every study's judgments share: the significance levels, the accuracy gates
and the one "no period" rule (docs/claims.md, "One standard").

A study that judges a trained model reads its gate accuracy and its period test through these,
so a control in one study and a cure in another are held to the same numbers.
"""

from __future__ import annotations

from chunkformer.evaluation.records.variant import VariantRecord

PERIOD_ALPHA = 0.01
NULL_ALPHA = 0.05
FULL_ACCURACY = 0.95
LEARNED_ACCURACY = 0.5  # far accuracy below this: the model did not learn the task


def no_period(p: float | None, detected_period: int | None) -> bool:
  """The one "no period" standard of controls (C2) and cures (C8, C9): the phase test at M
  gives p > 0.05 AND no candidate period is detected (family-wise over the periods)."""
  return p is not None and p > NULL_ALPHA and detected_period is None


def far_accuracy(r: VariantRecord) -> float | None:
  """The far-needle accuracy of a record (the primary probe's mean accuracy)."""
  return r.far_accuracy


def is_code_model(r: VariantRecord) -> bool:
  """A language model scored by the '=' prefix probe (synthetic code task, or a corpus LM
  with planted code needles): its period claim is C7, not C1."""
  return r.setup.task != "kv" and r.primary_probe == "prefix"


def gate_accuracy(r: VariantRecord) -> tuple[float | None, str]:
  """The accuracy the gates read, and its name: the training run's held-out far accuracy
  (rows as in training) where recorded for a kv model, else the sweep's far
  accuracy (its probe rows differ from training rows only in the moved needle)."""
  if is_code_model(r):
    return far_accuracy(r), "prefix-probe needle accuracy"
  held = r.heldout_far_accuracy if r.setup.task == "kv" else None
  if held is not None:
    return held, "held-out far accuracy"
  return far_accuracy(r), "far accuracy"
