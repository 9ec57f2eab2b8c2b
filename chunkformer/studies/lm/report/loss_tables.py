"""Report tables of the periodic signature in ordinary language modelling: markdown of the
records' ``lm_phase_loss`` signatures and of ``claims.loss_signatures`` (computed by the
judging step; nothing is computed here).

- ``unit_table``: per unit, the prefix probe's needle accuracy and byte accuracy on the code,
  bits per byte, the detrended excess loss per phase (position mod M), its amplitude and the
  permutation p-value (the record's ``lm_phase_loss.signature``);
- ``variant_table``: per variant, the seed-pooled signature, how many seeds show it, the seed
  rule's verdict on it and the paired differences against the control;
- ``plot_excess``: the pooled excess per phase of every variant, with intervals.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chunkformer.evaluation.records.formatting import MISSING, interval, number, p_value
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.report import plots
from chunkformer.evaluation.report.sections import View
from chunkformer.evaluation.stats import seed_rule

MILLI = 1000.0  # excess losses are shown in milli-nats: the effects are a few of them

# The seed rule's verdict on "the loss has a period-M signature", in words that read right for
# every variant (full attention is expected to have none).
_PRESENCE = {seed_rule.REPRODUCED: "present", seed_rule.NOT_REPRODUCED: "absent",
             seed_rule.INCONCLUSIVE: "undecided"}


def _excess(signature: Mapping[str, Any]) -> str:
  return ", ".join(number(None if v is None else MILLI * v, "+.1f")
                   for v in signature["excess_by_phase"])


def unit_table(records: Sequence[VariantRecord],
               code_accuracy: Mapping[str, float | None]) -> list[str]:
  """``code_accuracy``: unit -> the prefix probe's mean byte accuracy on the code."""
  units = [r for r in records if r.name in code_accuracy]  # the language models, in order
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
    needle = MISSING if r.prefix_probe is None else number(
        r.prefix_probe.analysis.mean_accuracy.value)
    lines.append(
        f"| {r.name} | {r.setup.chunking} | {needle} | {number(code_accuracy.get(r.name))} | "
        f"{interval(s['bits_per_byte'], s['bits_per_byte_low'], s['bits_per_byte_high'])} | "
        f"{_excess(s)} | {interval(s['amplitude'], s['amplitude_low'], s['amplitude_high'])} "
        f"| {p_value(s['p_value'])} |")
  return lines


def variant_table(pooled: Mapping[str, Mapping[str, Any]], alpha: float) -> list[str]:
  """``pooled``: ``claims.loss_signatures.pooled_signatures``."""
  if not pooled:
    return []
  first = next(iter(pooled.values()))
  m, control = first["signature"]["chunk_size"], first["control"]
  lines = ["", f"## Loss by position mod {m} (language models, seeds pooled)", "",
           "Each variant's seeds' held-out rows stacked. Signature: present / absent by the "
           f"study's seed rule (p < {alpha} in >= 2 of 3 seeds and in the pooled test; "
           "undecided when they disagree). Versus "
           f"{control or 'the control'}: amplitude and bits/byte differences on the same "
           "held-out rows (seeds "
           "matched; paired basic bootstrap interval).", "",
           "| variant | seeds | bits/byte | excess by phase (mnats) | amplitude | p (pooled) | "
           f"seeds with p < {alpha} | signature | amplitude - {control or 'control'} | "
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


def sections(view: View) -> str:
  """The unit and variant tables and the figure (empty without language-model records); no
  pooled signatures (no stored rows to pool): the variant table and figure are left out."""
  code_accuracy, pooled = view.tables.code_accuracy, view.tables.loss_signatures
  plots_dir, directory = view.plots_dir, view.directory
  lines = unit_table(view.records, code_accuracy)
  if pooled is not None and lines:
    lines += variant_table(pooled, view.tables.alpha)
    figure = plot_excess(os.path.join(plots_dir, "lm_loss_by_phase.png"), pooled)
    if figure is not None:
      relative = os.path.relpath(figure, directory).replace(os.sep, "/")
      lines += ["", f"![loss by position mod M, seeds pooled]({relative})"]
  return "\n".join(lines) + ("\n" if lines else "")
