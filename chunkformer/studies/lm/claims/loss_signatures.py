"""The statistics behind the report's loss-by-position tables (language models), computed once
by ``judge`` from the stored per-token rows (``records.loss_rows``, ``DIR/lm_loss/<unit>.npz``).

- ``code_accuracies``: per unit, the prefix probe's mean byte accuracy on the code itself;
- ``pooled_signatures``: per variant, its seeds' rows stacked (held-out rows of different
  seeds are different sequences, so stacking gives more independent rows): the pooled
  signature, how many seeds show it (p < ALPHA) with the seed rule's verdict on "the loss has
  a period-M signature" (>= 2 of 3 seeds and the pooled test), and the paired amplitude and
  bits-per-byte differences against the control (full attention without key shift) on the
  same rows (``loss_phase.amplitude_difference``, ``bits_per_byte_difference``: seeds
  matched, rows resampled together).
Computed with the sweep's seed and resample counts, so the tables follow from DIR alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chunkformer.evaluation.claims import seed_pooling
from chunkformer.evaluation.records.loss_rows import RowsLoader, stack
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.stats import loss_phase, seed_rule

ALPHA = 0.05  # a seed's loss signature counts as present below this p-value


def lm_records(records: Sequence[VariantRecord]) -> list[VariantRecord]:
  """Language-model records with a stored signature (older records have none)."""
  return [r for r in records if r.lm_phase_loss is not None and "signature" in r.lm_phase_loss]


def code_accuracies(records: Sequence[VariantRecord]) -> dict[str, float | None]:
  """unit -> mean over N of the prefix probe's byte accuracy on the code (None without)."""
  out = {}
  for r in lm_records(records):
    code = None if r.prefix_probe is None else r.prefix_probe.code_accuracy_by_prefix
    out[r.name] = float(np.mean(code)) if code else None
  return out


def _control(groups: Mapping[str, list[VariantRecord]]) -> str | None:
  """The variant the others are compared with: full attention without key shift."""
  for name, runs in groups.items():
    if runs[0].setup.attention == "full" and not runs[0].setup.key_shift_width:
      return name
  return None


def _paired(runs: Sequence[VariantRecord], control: Sequence[VariantRecord], load: RowsLoader,
            period: int, **kwargs) -> dict[str, float] | None:
  """Amplitude and bits/byte of variant minus control over the seeds both have, rows paired."""
  by_seed = {r.setup.seed: r for r in control}
  pairs = [(load(r.name), load(by_seed[r.setup.seed].name)) for r in runs
           if r.setup.seed in by_seed]
  pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
  if not pairs:
    return None
  a, b = stack([p[0] for p in pairs]), stack([p[1] for p in pairs])
  if not (np.array_equal(a.mask_NxT, b.mask_NxT) and np.array_equal(a.bytes_NxT, b.bytes_NxT)):
    return None  # not the same held-out rows: no paired comparison
  return {"amplitude": loss_phase.amplitude_difference(a.loss_NxT, b.loss_NxT, a.mask_NxT,
                                                       period, **kwargs),
          "bits_per_byte": loss_phase.bits_per_byte_difference(a.loss_NxT, b.loss_NxT,
                                                               a.mask_NxT, a.bytes_NxT, **kwargs)}


def pooled_signatures(records: Sequence[VariantRecord], load: RowsLoader, *, seed: int = 0,
                      num_resamples: int = 1000, num_permutations: int = 2000
                      ) -> dict[str, dict[str, Any]]:
  """variant -> {"runs", "signature" (seeds' rows stacked), "agreement", "versus_control",
  "control"}."""
  groups = seed_pooling.by_variant(lm_records(records))
  stored = {r.name: load(r.name) for runs in groups.values() for r in runs}  # each file once
  control = _control(groups)
  resampling = dict(seed=seed, num_resamples=num_resamples)
  out = {}
  for name, runs in groups.items():
    rows = [stored[r.name] for r in runs]
    if any(x is None for x in rows):
      continue
    period = runs[0].lm_phase_loss["signature"]["chunk_size"]
    pooled = stack(rows).signature(period, num_permutations=num_permutations, **resampling)
    holds = [r.lm_phase_loss["signature"]["p_value"] < ALPHA for r in runs]
    out[name] = {
        "runs": runs, "signature": pooled,
        "agreement": seed_rule.seed_agreement(holds, pooled["p_value"] < ALPHA),
        "versus_control": (None if control is None or name == control else
                           _paired(runs, groups[control], stored.get, period, **resampling)),
        "control": control,
    }
  return out


@dataclasses.dataclass(frozen=True)
class Tables:
  """What the language-model section shows (``report.loss_tables``)."""

  code_accuracy: Mapping[str, float | None]  # LM unit -> its prefix probe's code accuracy
  # variant -> pooled loss signature; None without stored loss rows
  loss_signatures: Mapping[str, dict[str, Any]] | None
  alpha: float = ALPHA


def tables(e) -> Tables:
  """The judging hook: the code accuracies, and the pooled signatures where rows are stored."""
  code = code_accuracies(e.records)
  signatures = None
  if e.loss_rows is not None and code:
    signatures = pooled_signatures(e.records, e.loss_rows, **e.resampling)
  return Tables(code, signatures)
