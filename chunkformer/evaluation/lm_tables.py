"""Report tables of the periodic signature in ordinary language modelling (issue 15).

For language-model units (records with ``lm_phase_loss``), from the stored per-token rows
(``lm_phase_loss.Rows``, ``DIR/lm_loss/<unit>.npz``) and the records:

- ``unit_table``: per unit, the prefix probe's needle accuracy and byte accuracy on the code,
  bits per byte, the detrended excess loss per phase (position mod M), its amplitude and the
  permutation p-value (the record's ``lm_phase_loss.signature``);
- ``variant_table``: per variant, its seeds' rows stacked (held-out rows of different seeds are
  different sequences, so stacking gives more independent rows): the pooled signature, how
  many seeds show it (p < ALPHA) with the seed-agreement verdict of "the loss has a period-M
  signature" (``seed_agreement``: >= 2 of 3 seeds and the pooled test), and the paired
  amplitude and bits-per-byte differences against the control (full attention without key
  shift) on the same rows (``loss_phase.amplitude_difference``, ``bits_per_byte_difference``:
  seeds matched, rows resampled together);
- ``plot_excess``: the pooled excess per phase of every variant, with intervals.
Statistics are recomputed here from the rows with the sweep's seed and resample counts, so the
tables follow from DIR alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from chunkformer.evaluation import loss_phase, plots, seed_agreement, seed_pooling
from chunkformer.evaluation.formatting import MISSING, interval, number, p_value
from chunkformer.evaluation.lm_phase_loss import Rows, stack
from chunkformer.evaluation.variant_record import VariantRecord

ALPHA = 0.05
MILLI = 1000.0  # excess losses are shown in milli-nats: the effects are a few of them

RowsLoader = Callable[[str], Rows | None]
# The seed rule's verdict on "the loss has a period-M signature", in words that read right for
# every variant (full attention is expected to have none).
_PRESENCE = {seed_agreement.REPRODUCED: "present", seed_agreement.NOT_REPRODUCED: "absent",
             seed_agreement.INCONCLUSIVE: "undecided"}


def _lm_records(records: Sequence[VariantRecord]) -> list[VariantRecord]:
  """Language-model records with a stored signature (older records have none)."""
  return [r for r in records if r.lm_phase_loss is not None and "signature" in r.lm_phase_loss]


def _excess(signature: Mapping[str, Any]) -> str:
  return ", ".join(number(None if v is None else MILLI * v, "+.1f")
                   for v in signature["excess_by_phase"])


def _probe_accuracies(r: VariantRecord) -> tuple[str, str]:
  probe = r.prefix_probe
  if probe is None:
    return MISSING, MISSING
  code = probe.code_accuracy_by_prefix
  return (number(probe.analysis.mean_accuracy.value),
          MISSING if not code else number(float(np.mean(code))))


def unit_table(records: Sequence[VariantRecord]) -> list[str]:
  units = _lm_records(records)
  if not units:
    return []
  m = units[0].lm_phase_loss["signature"]["chunk_size"]
  lines = ["", f"## Loss by position mod {m} (language models, per unit)", "",
           "Held-out code targets (needle answers excluded). Excess: the per-position mean loss "
           "minus its one-period moving average, averaged per phase, in milli-nats (the fall of "
           "the loss over a row's first positions removed); amplitude = max - min excess "
           "(nats, basic bootstrap interval over rows); p: permutation test of the phase "
           "effect. Needle acc: the '=' prefix probe's exact answers; code byte acc: its byte "
           "accuracy on the code itself (means over N).", "",
           "| unit | chunking | needle acc | code byte acc | bits/byte | excess by phase (mnats) "
           "| amplitude | p |", "|:--|:--|--:|--:|--:|:--|--:|--:|"]
  for r in units:
    s = r.lm_phase_loss["signature"]
    needle, code = _probe_accuracies(r)
    lines.append(
        f"| {r.name} | {r.setup.chunking} | {needle} | {code} | "
        f"{interval(s['bits_per_byte'], s['bits_per_byte_low'], s['bits_per_byte_high'])} | "
        f"{_excess(s)} | {interval(s['amplitude'], s['amplitude_low'], s['amplitude_high'])} "
        f"| {p_value(s['p_value'])} |")
  return lines


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
  """variant -> {"runs", "signature" (seeds' rows stacked), "agreement", "versus_control"}."""
  groups = seed_pooling.by_variant(_lm_records(records))
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
        "agreement": seed_agreement.seed_agreement(holds, pooled["p_value"] < ALPHA),
        "versus_control": (None if control is None or name == control else
                           _paired(runs, groups[control], stored.get, period, **resampling)),
        "control": control,
    }
  return out


def variant_table(pooled: Mapping[str, Mapping[str, Any]]) -> list[str]:
  if not pooled:
    return []
  first = next(iter(pooled.values()))
  m, control = first["signature"]["chunk_size"], first["control"]
  lines = ["", f"## Loss by position mod {m} (language models, seeds pooled)", "",
           "Each variant's seeds' held-out rows stacked. Signature: present / absent by the "
           f"study's seed rule (p < {ALPHA} in >= 2 of 3 seeds and in the pooled test; "
           "undecided when they disagree). Versus "
           f"{control or 'the control'}: amplitude and bits/byte differences on the same "
           "held-out rows (seeds "
           "matched; paired basic bootstrap interval).", "",
           "| variant | seeds | bits/byte | excess by phase (mnats) | amplitude | p (pooled) | "
           f"seeds with p < {ALPHA} | signature | amplitude - {control or 'control'} | "
           f"bits/byte - {control or 'control'} |",
           "|:--|--:|--:|:--|--:|--:|--:|:--|--:|--:|"]
  for name, entry in pooled.items():
    s, agree, diff = entry["signature"], entry["agreement"], entry["versus_control"]
    versus = " | ".join(
        MISSING if diff is None else interval(diff[key]["difference"],
                                              diff[key]["difference_low"],
                                              diff[key]["difference_high"])
        for key in ("amplitude", "bits_per_byte"))
    lines.append(
        f"| {name} | {len(entry['runs'])} | "
        f"{interval(s['bits_per_byte'], s['bits_per_byte_low'], s['bits_per_byte_high'])} | "
        f"{_excess(s)} | {interval(s['amplitude'], s['amplitude_low'], s['amplitude_high'])} "
        f"| {p_value(s['p_value'])} | {agree.count} | {_PRESENCE[agree.verdict]}"
        f"{f' ({agree.reason})' if agree.reason else ''} | {versus} |")
  return lines


def plot_excess(path: str, pooled: Mapping[str, Mapping[str, Any]]) -> str | None:
  """Grouped bars: each variant's pooled excess loss per phase (milli-nats) with intervals."""
  if not pooled:
    return None
  curves = {name: tuple(MILLI * np.asarray(e["signature"][key], np.float64)
                        for key in ("excess_by_phase", "excess_by_phase_low",
                                    "excess_by_phase_high"))
            for name, e in pooled.items()}
  return plots.plot_grouped_phases(path, curves, ylabel="excess loss (milli-nats)",
                                   xlabel="position mod M (held-out code targets)",
                                   title="loss by position mod M, seeds pooled (detrended)")


def sections(records: Sequence[VariantRecord], load: RowsLoader | None, plots_dir: str,
             directory: str, **resampling) -> str:
  """The unit and variant tables and the figure (empty without language-model records)."""
  lines = unit_table(records)
  if load is not None and lines:
    pooled = pooled_signatures(records, load, **resampling)
    lines += variant_table(pooled)
    figure = plot_excess(os.path.join(plots_dir, "lm_loss_by_phase.png"), pooled)
    if figure is not None:
      relative = os.path.relpath(figure, directory).replace(os.sep, "/")
      lines += ["", f"![loss by position mod M, seeds pooled]({relative})"]
  return "\n".join(lines) + ("\n" if lines else "")
