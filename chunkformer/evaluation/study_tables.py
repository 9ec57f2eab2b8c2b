"""Report tables of the study's judged claims (issue 15): markdown text from records and claims.

- ``split_label_tables`` (C5): per needle block (needle lengths and training steps), plain
  fixed models' accuracy per split label (none / partial / total, and the two partial kinds)
  per M with mean accuracy and gap, pooled over seeds (trial-weighted), and C5's paired gap
  difference. A record without the stored ``split_labels`` analysis (1-token needles, older
  sweeps) is labelled from its per-phase accuracy: with fixed chunks the split kind depends
  only on the phase offset mod M (``split_labels.phase_split_kinds``), weighted by the number
  of offsets in each phase.
- ``slot_null_table`` (C6): the site statistics of C6's claim numbers (trained vs init,
  pooled permutation p, seeds agreeing).
- ``chunk_phase_table`` (C8): dynamic models' accuracy by the needle's phase inside its actual
  chunk, with how often each phase occurs (from the stored phases; '-' without them).
- ``shift_map`` (C9): gap / mean accuracy over key shift width x needle block for fixed
  M = 4 models and the router on the same needles, and full attention with and without the
  shift (the control: what the shift costs or gives without compression), '-' where no
  record exists. ``phase_dependent_map``: on the same grid, per seed, how many far-depth
  haystacks carry the period (accuracy by phase spanning >= 0.5), so a significant but small
  gap can be told apart as a rare, needle-specific blind spot or a general one.
- ``seed_table``: per variant with several seeds, far accuracy and max gap per seed, their
  mean with a Student-t interval across seeds, and the seed-pooled record's bootstrap interval
  (haystacks of every seed) and period-test p-value (``seed_pooling``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from chunkformer.evaluation import (
  correctness,
  estimates,
  seed_agreement,
  seed_pooling,
  split_labels,
  study_claims,
  verdicts,
)
from chunkformer.evaluation.claims import Claim
from chunkformer.evaluation.formatting import MISSING, interval, number, p_value
from chunkformer.evaluation.variant_record import VariantRecord

SHIFT_WIDTHS = (0, 2, 3, 4)
NEEDLE_LENGTHS = (1, 2, 3)
_KINDS_SHOWN = ("none", "key_cut", "value_cut", "total")


def _phase_labels(r: VariantRecord) -> dict[str, dict[str, Any]]:
  """Accuracy and trials per kind and label, from the phase table (fixed chunks)."""
  m = r.chunk_size
  table = r.analysis.by_chunk_size[0].table
  kinds = split_labels.phase_split_kinds(m, r.setup.key_len, r.setup.value_len)
  counts = np.bincount(np.mod(np.asarray(r.analysis.offsets), m), minlength=m)
  trials = counts * r.analysis.num_haystacks
  out: dict[str, dict[str, Any]] = {}
  for phase, accuracy in zip(table.phases, table.accuracy.values, strict=True):
    if accuracy is None:
      continue
    kind = kinds[phase]
    for name in (kind, split_labels.COARSE[kind]):
      entry = out.setdefault(name, {"correct": 0.0, "trials": 0})
      entry["correct"] += accuracy * trials[phase]
      entry["trials"] += int(trials[phase])
  return {k: {"accuracy": v["correct"] / v["trials"], "trials": v["trials"]}
          for k, v in out.items() if v["trials"]}


def _labels(r: VariantRecord) -> tuple[dict[str, dict[str, Any]], bool]:
  """(name -> {"accuracy", "trials"} for kinds and labels, stored?)."""
  s = r.split_labels
  if s is None:
    return _phase_labels(r), False
  out = {k: v for k, v in s["by_kind"].items() if v["trials"]}
  out.update({k: v for k, v in s["by_label"].items() if v["trials"]})
  return out, True


def _pooled(entries: Sequence[dict[str, dict[str, Any]]], name: str) -> float | None:
  found = [e[name] for e in entries if name in e and e[name]["accuracy"] is not None]
  trials = sum(x["trials"] for x in found)
  return None if not trials else sum(x["accuracy"] * x["trials"] for x in found) / trials


def split_label_tables(records: Sequence[VariantRecord], c5: Claim | None = None) -> list[str]:
  plain = [r for r in records if verdicts.is_plain_fixed(r) and r.setup.task == "kv"]
  if not plain:
    return []
  lines = ["", "## Split labels (C5): accuracy per split of the needle, far depth", "",
           "Labels fixed in advance from the chunk grid (a boundary between key and value: "
           "total; inside key or value only: partial, key cut / value cut; none). Seeds pooled "
           "by trials; mean accuracy and gap: mean over seeds. * = labelled from the per-phase "
           "accuracy (no stored split analysis)."]
  groups: dict[tuple[int, int, int], dict[int, list[VariantRecord]]] = {}
  for r in plain:
    groups.setdefault(verdicts.needle_block(r), {}).setdefault(r.chunk_size, []).append(r)
  for (key_len, value_len, steps), by_m in sorted(groups.items()):
    lines += ["", f"Key {key_len} / value {value_len} token(s), {steps} steps:", "",
              "| M | seeds | kinds by phase | none | partial | total | key cut | value cut | "
              "mean acc | gap |", "|--:|--:|:--|--:|--:|--:|--:|--:|--:|--:|"]
    for m, runs in sorted(by_m.items()):
      found = [_labels(r) for r in runs]
      entries = [e for e, _ in found]
      star = "" if all(stored for _, stored in found) else "*"
      kinds = split_labels.phase_split_kinds(m, key_len, value_len)
      cells = [number(_pooled(entries, name)) for name in ("none", "partial", "total", "key_cut",
                                                        "value_cut")]
      means = [r.far_accuracy for r in runs if r.far_accuracy is not None]
      gaps = [r.analysis.max_gap for r in runs if r.analysis.max_gap is not None]
      lines.append(f"| {m}{star} | {len(runs)} | {', '.join(kinds)} | {' | '.join(cells)} | "
                   f"{number(np.mean(means) if means else None)} | "
                   f"{number(np.mean(gaps) if gaps else None)} |")
    group = (c5.numbers.get(study_claims.c5_group_name(key_len, value_len, steps))
             if c5 is not None else None)
    if isinstance(group, dict) and "difference" in group:
      lines += ["", f"Paired gap(M=2) - gap(M=4): {group['difference']:.3f} "
                f"[{group['difference_low']:.3f}, {group['difference_high']:.3f}] over "
                f"{group['num_haystacks']} haystacks x {group['num_seeds']} seed(s): "
                f"{group['verdict']}."]
  return lines


def slot_null_table(c6: Claim | None) -> list[str]:
  if c6 is None or not any(isinstance(v, dict) and "sites" in v for v in c6.numbers.values()):
    return []
  lines = ["", "## Slot gains against the null (C6)", "",
           "shift: mean preferred phase minus the chunk centre (slots); spread: max-min "
           "preferred phase over heads; deviation: distance of the weights from uniform. Trained "
           "mean [interval over seeds], at initialisation, seed-pooled permutation p (shift and "
           "spread), seeds agreeing.", "",
           "| variant | site | statistic | trained | init | p (pooled) | seeds agreeing | "
           "verdict |", "|:--|:--|:--|--:|--:|--:|--:|:--|"]
  for variant, entry in c6.numbers.items():
    for site, stats in entry.get("sites", {}).items():
      for name in ("shift", "spread", "deviation"):
        s = stats[name]
        interval = (number(s["mean"]) if s["low"] is None
                    else f"{s['mean']:.3f} [{s['low']:.3f}, {s['high']:.3f}]")
        p = s.get("pooled_p_value")
        verdict = s.get("verdict", f"site: {stats['verdict']}")  # deviation: the site's
        lines.append(f"| {variant} | {site} | {name} | {interval} | {number(s.get('init'))} | "
                     f"{number(p, '.3g')} | {s.get('seeds_agreeing', MISSING)} | {verdict} |")
  return lines


def chunk_phase_table(records: Sequence[VariantRecord], load=None) -> list[str]:
  dynamic = [r for r in records if r.chunk_phase is not None]
  if not dynamic:
    return []
  lines = ["", "## Dynamic chunks: accuracy by the needle's phase inside its actual chunk", "",
           "The weak spot relative to the chunk the needle landed in (content-relative "
           "position), and how often each phase occurs among the far-depth trials.", "",
           "| variant | phases | weakest phase | accuracy there | max gap | p | "
           "phase: accuracy (share of trials) |", "|:--|--:|--:|--:|--:|--:|:--|"]
  for r in dynamic:
    c = r.chunk_phase
    weakest = min((a, p) for a, p in zip(c.accuracy.values, c.phases, strict=True)
                  if a is not None)
    shares = _phase_shares(r, load)
    listed = ", ".join(
        f"{p}: {number(a, '.2f')}" + ("" if shares is None else
                                  f" ({shares.get(p, 0.0):.1%})")
        for p, a in zip(c.phases, c.accuracy.values, strict=True))
    lines.append(f"| {r.name} | 0..{max(c.phases)} | {c.weakest_phase} | {weakest[0]:.3f} | "
                 f"{c.gap.value:.3f} | {c.p_value:.3g} | {listed} |")
  return lines


def _phase_shares(r: VariantRecord, load) -> dict[int, float] | None:
  """Share of the far-depth trials in each phase inside the actual chunk (stored phases)."""
  matrix = study_claims.far_matrix(r, load) if load is not None else None
  if matrix is None or matrix.phases_YxJ is None:
    return None
  phases, counts = np.unique(matrix.phases_YxJ, return_counts=True)
  return {int(p): float(c) / matrix.phases_YxJ.size for p, c in zip(phases, counts,
                                                                      strict=True)}


_SHIFT_KINDS = ("fixed M=4", "router 4", "full")  # the shift map's models, in row order


class _ShiftRow(NamedTuple):
  """A row of the shift map (``order`` sorts them: by model, plain key shifts, then delayed
  ones, then shifts of keys and queries; then width)."""

  kind: int  # index into _SHIFT_KINDS
  frozen_steps: int  # updates before the shift trains (train.shift_frozen_steps)
  width: int  # 0 = no shift
  queries: bool = False  # the queries carry the shift too (model.query_shift)

  @property
  def label(self) -> str:
    after = f" after step {self.frozen_steps}" if self.frozen_steps else ""
    on = " (keys and queries)" if self.queries else ""
    return f"{_SHIFT_KINDS[self.kind]}, shift {self.width}{on}{after}"

  def order(self) -> tuple[int, bool, bool, int, int]:
    return self.kind, self.queries, self.frozen_steps > 0, self.width, self.frozen_steps


def _shift_row_of(r: VariantRecord) -> _ShiftRow | None:
  s = r.setup
  if s.task != "kv":
    return None
  shift = ((s.key_shift_frozen_steps, s.key_shift_width, s.query_shift) if s.key_shift
           else (0, 0, False))
  if s.attention == "full":
    return _ShiftRow(2, *shift)
  if s.chunk_size != 4:
    return None
  if s.attention == "fixed" and s.rope and s.pooling == "gated" and not (
      s.overlap or s.stagger or s.random_phase):
    return _ShiftRow(0, *shift)
  if s.attention == "dynamic" and s.chunking.startswith("dynamic/router"):
    return _ShiftRow(1, *shift)
  return None


def _shift_grid(records: Sequence[VariantRecord], title: str, note: str,
                cell: Callable[[list[VariantRecord]], str]) -> list[str]:
  """A table over the shift map's rows (model, shift) and columns (needle block); ``cell``
  formats the records of one cell (their seeds)."""
  cells: dict[tuple[_ShiftRow, tuple[int, int, int]], list[VariantRecord]] = {}
  for r in records:
    row = _shift_row_of(r)
    if row is not None:
      cells.setdefault((row, verdicts.needle_block(r)), []).append(r)
  if not cells:
    return []
  blocks = sorted({b for _, b in cells})
  shown = {(k, v) for k, v, _ in blocks}
  columns = sorted([*blocks, *((k, k, None) for k in NEEDLE_LENGTHS if (k, k) not in shown)],
                   key=lambda b: (b[0], b[1], b[2] or 0))
  # every plain fixed width of the map has a row, measured or not
  rows = sorted({row for row, _ in cells} | {_ShiftRow(0, 0, w) for w in SHIFT_WIDTHS},
                key=_ShiftRow.order)

  def heading(block):
    k, v, steps = block
    return f"key/value {k}/{v}" + ("" if steps is None else f", {steps} steps")

  lines = ["", f"## {title}", "", f"{note}; a column per needle length and training budget; "
           "'-' = no such record in the sweep.", "",
           "| model | " + " | ".join(heading(b) for b in columns) + " |",
           "|:--|" + "--:|" * len(columns)]
  for row in rows:
    out = []
    for block in columns:
      runs = sorted(cells.get((row, block), []), key=lambda r: r.setup.seed)
      out.append(cell(runs) if runs else MISSING)
    lines.append(f"| {row.label} | " + " | ".join(out) + " |")
  return lines


def shift_map(records: Sequence[VariantRecord]) -> list[str]:
  def gap_and_accuracy(runs):
    gaps = [r.analysis.max_gap for r in runs if r.analysis.max_gap is not None]
    accs = [r.far_accuracy for r in runs if r.far_accuracy is not None]
    mean_gap = number(np.mean(gaps) if gaps else None)
    mean_acc = number(np.mean(accs) if accs else None)
    return f"{mean_gap} / {mean_acc} (n={len(runs)})"

  return _shift_grid(
      records, "Key shift map (C9): gap / mean far accuracy by shift width and needle length",
      "Seeds averaged (n = seeds)", gap_and_accuracy)


PHASE_DEPENDENT = 0.5  # best-phase minus worst-phase accuracy of one haystack's needle
MAP_PERIOD = 4  # the shift map's models are M = 4 (or the router at 4, or full attention)


def phase_dependent_needles(matrix: correctness.Matrix,
                            period: int) -> tuple[np.ndarray, np.ndarray]:
  """(haystacks_H, accuracy_HxP): the haystacks whose needle accuracy, by offset mod
  ``period``, spans >= PHASE_DEPENDENT, and their accuracy at each phase 0 .. period-1 (NaN
  for a phase no offset has)."""
  labels_G, accuracy_YxG = estimates.haystack_phase_accuracy(
      matrix.correct_YxJ, estimates.phases_of_offsets(matrix.offsets_J, period))
  # a phase without trials in a haystack (NaN) is left out of its span
  spans_Y = np.nanmax(accuracy_YxG, axis=1) - np.nanmin(accuracy_YxG, axis=1)
  haystacks_H = np.flatnonzero(spans_Y >= PHASE_DEPENDENT)
  accuracy_HxP = np.full((haystacks_H.size, period), np.nan)
  accuracy_HxP[:, labels_G] = accuracy_YxG[haystacks_H]
  return haystacks_H, accuracy_HxP


def phase_dependent_haystacks(matrix: correctness.Matrix, period: int) -> int:
  """How many haystacks ``phase_dependent_needles`` finds.

  A period test pools every haystack; this says how many carry the period: a blind spot in
  every needle, or a few needles found at some phases and missed at the others.
  """
  return int(phase_dependent_needles(matrix, period)[0].size)


def phase_dependent_map(records: Sequence[VariantRecord], load) -> list[str]:
  """Per shift-map cell and seed, how many far-depth haystacks depend on the phase."""
  if load is None:
    return []

  def counts(runs):
    out = []
    for r in runs:
      matrix = study_claims.far_matrix(r, load)
      out.append(None if matrix is None else (phase_dependent_haystacks(matrix, MAP_PERIOD),
                                              matrix.correct_YxJ.shape[0]))
    if any(c is None for c in out):
      return MISSING
    return ", ".join(str(n) for n, _ in out) + f" of {out[0][1]}"

  return _shift_grid(
      records, "Where the period lives (C9): far-depth haystacks whose needle accuracy depends "
      "on the phase", f"Per seed (seed order), haystacks whose accuracy by offset mod "
      f"{MAP_PERIOD} spans >= {PHASE_DEPENDENT} (found at some phases, missed at others); full "
      "attention shows the count without a chunk grid", counts)


def _across_seeds(values: Sequence[float | None]) -> str:
  known = [v for v in values if v is not None]
  if len(known) < 2:
    return MISSING
  est = seed_agreement.seed_interval(known)
  return interval(est.mean, est.low, est.high)


def seed_table(records: Sequence[VariantRecord],
               pooled: Mapping[str, VariantRecord] | None) -> list[str]:
  groups = {v: runs for v, runs in seed_pooling.by_variant(records).items() if len(runs) > 1}
  if not groups:
    return []
  lines = ["", "## Seeds: per seed, across seeds (Student t) and seed-pooled (bootstrap)", "",
           "Far depth (the primary probe). Pooled: every seed's haystacks analysed as one "
           "model; its p is the period test at M; '-' = no pooled record (matrices missing). "
           "Gap intervals are basic (reflected) bootstrap intervals: a max-min over phases is "
           "biased upwards under noise, so an interval can lie below its own point estimate, "
           "which says that most of that gap is noise.",
           "", "| variant | seeds | far accuracy per seed | mean [95% t] | pooled [95% "
           "bootstrap] | max gap per seed | mean [95% t] | pooled gap [95% bootstrap] | "
           "pooled p |", "|:--|--:|:--|:--|:--|:--|:--|:--|--:|"]
  for variant, runs in groups.items():
    far = [r.far_accuracy for r in runs]
    gap = [r.analysis.phase.gap.value for r in runs]
    p = (pooled or {}).get(variant)  # several seeds: a pooled record, or none
    pooled_far = pooled_gap = MISSING
    if p is not None:
      far_i, gap_i = p.analysis.mean_accuracy, p.analysis.phase.gap
      pooled_far = interval(far_i.value, far_i.low, far_i.high)
      pooled_gap = interval(gap_i.value, gap_i.low, gap_i.high)
    lines.append(f"| {variant} | {len(runs)} | {' / '.join(number(x) for x in far)} | "
                 f"{_across_seeds(far)} | {pooled_far} | "
                 f"{' / '.join(number(x) for x in gap)} | {_across_seeds(gap)} | {pooled_gap} "
                 f"| {MISSING if p is None else p_value(p.analysis.p_value)} |")
  return lines


def sections(records: Sequence[VariantRecord], claims: Sequence[Claim] = (),
             load=None, pooled: Mapping[str, VariantRecord] | None = None) -> str:
  """Every table above, as one markdown block (empty when none applies)."""
  by_id = {c.id: c for c in claims}
  lines = (seed_table(records, pooled) + split_label_tables(records, by_id.get("C5"))
           + slot_null_table(by_id.get("C6")) + chunk_phase_table(records, load)
           + shift_map(records) + phase_dependent_map(records, load))
  return "\n".join(lines) + ("\n" if lines else "")
