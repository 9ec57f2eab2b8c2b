"""Report tables of the judged claims: markdown of ``claims.summaries`` and the claims' numbers
(the judging step computes every number; these functions only format them).

- ``seed_table``: per variant with several seeds, far accuracy and max gap per seed, across
  seeds (Student t) and seed-pooled (bootstrap), the pooled period-test p-value;
- ``split_label_tables`` (C5): accuracy per split label per M and needle block, and C5's
  paired gap difference from its claim numbers;
- ``slot_null_table`` (C6): the site statistics of C6's claim numbers (trained vs init,
  pooled permutation p, seeds agreeing);
- ``chunk_phase_table`` (C8): dynamic models' accuracy by the needle's phase inside its actual
  chunk, with how often each phase occurs ('-' without stored phases);
- ``shift_map`` and ``phase_dependent_map`` (C9): the shift grid's gap / mean accuracy and, per
  seed, how many far-depth haystacks carry the period.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.formatting import MISSING, interval, number, p_value
from chunkformer.evaluation.report.sections import View
from chunkformer.evaluation.stats.estimates import PHASE_DEPENDENT, Estimate
from chunkformer.studies.needles.claims import summaries


def _across(estimate: Estimate | None) -> str:
  return MISSING if estimate is None else interval(estimate.mean, estimate.low, estimate.high)


def seed_table(rows: Sequence[summaries.SeedRow]) -> list[str]:
  if not rows:
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
  for row in rows:
    p = row.pooled
    pooled_far = pooled_gap = MISSING
    if p is not None:
      far_i, gap_i = p.analysis.mean_accuracy, p.analysis.phase.gap
      pooled_far = interval(far_i.value, far_i.low, far_i.high)
      pooled_gap = interval(gap_i.value, gap_i.low, gap_i.high)
    lines.append(f"| {row.variant} | {len(row.far_per_seed)} | "
                 f"{' / '.join(number(x) for x in row.far_per_seed)} | "
                 f"{_across(row.far_across)} | {pooled_far} | "
                 f"{' / '.join(number(x) for x in row.gap_per_seed)} | "
                 f"{_across(row.gap_across)} | {pooled_gap} "
                 f"| {MISSING if p is None else p_value(p.analysis.p_value)} |")
  return lines


def split_label_tables(blocks: Sequence[summaries.SplitLabelBlock],
                       c5: Claim | None = None) -> list[str]:
  if not blocks:
    return []
  lines = ["", "## Split labels (C5): accuracy per split of the needle, far depth", "",
           "Labels fixed in advance from the chunk grid (a boundary between key and value: "
           "total; inside key or value only: partial, key cut / value cut; none). Seeds pooled "
           "by trials; mean accuracy and gap: mean over seeds. * = labelled from the per-phase "
           "accuracy (no stored split analysis)."]
  for block in blocks:
    lines += ["", f"Key {block.key_len} / value {block.value_len} token(s), {block.steps} "
              "steps:", "",
              "| M | seeds | kinds by phase | none | partial | total | key cut | value cut | "
              "mean acc | gap |", "|--:|--:|:--|--:|--:|--:|--:|--:|--:|--:|"]
    for row in block.rows:
      cells = [number(row.accuracy[name]) for name in summaries.SPLIT_COLUMNS]
      lines.append(f"| {row.chunk_size}{'*' if row.from_phases else ''} | {row.seeds} | "
                   f"{', '.join(row.kinds_by_phase)} | {' | '.join(cells)} | "
                   f"{number(row.mean_accuracy)} | {number(row.mean_gap)} |")
    group = (c5.numbers.get(block.c5_group)
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
        trained = (number(s["mean"]) if s["low"] is None
                   else f"{s['mean']:.3f} [{s['low']:.3f}, {s['high']:.3f}]")
        p = s.get("pooled_p_value")
        verdict = s.get("verdict", f"site: {stats['verdict']}")  # deviation: the site's
        lines.append(f"| {variant} | {site} | {name} | {trained} | {number(s.get('init'))} | "
                     f"{number(p, '.3g')} | {s.get('seeds_agreeing', MISSING)} | {verdict} |")
  return lines


def chunk_phase_table(rows: Sequence[summaries.ChunkPhaseRow]) -> list[str]:
  if not rows:
    return []
  lines = ["", "## Dynamic chunks: accuracy by the needle's phase inside its actual chunk", "",
           "The weak spot relative to the chunk the needle landed in (content-relative "
           "position), and how often each phase occurs among the far-depth trials. A weakest "
           "phase in parentheses is only the lowest: its band overlaps another phase's.", "",
           "| variant | phases | weakest phase | accuracy there | max gap | p | "
           "phase: accuracy (share of trials) |", "|:--|--:|--:|--:|--:|--:|:--|"]
  for row in rows:
    r, c, shares = row.record, row.record.chunk_phase, row.shares
    listed = ", ".join(
        f"{p}: {number(a, '.2f')}" + ("" if shares is None else
                                  f" ({shares.get(p, 0.0):.1%})")
        for p, a in zip(c.phases, c.accuracy.values, strict=True))
    lines.append(f"| {r.name} | 0..{max(c.phases)} | {c.weakest_label()} | "
                 f"{row.weakest_accuracy:.3f} | {c.gap.value:.3f} | {c.p_value:.3g} | {listed} |")
  return lines


def _shift_table(grid: summaries.ShiftGrid, title: str, note: str,
                 cell: Callable[[summaries.ShiftCell], str]) -> list[str]:
  """A table over the shift grid's rows (model, shift) and columns (needle block)."""
  def heading(block):
    k, v, steps = block
    return f"key/value {k}/{v}" + ("" if steps is None else f", {steps} steps")

  lines = ["", f"## {title}", "", f"{note}; a column per needle length and training budget; "
           "'-' = no such record in the sweep.", "",
           "| model | " + " | ".join(heading(b) for b in grid.columns) + " |",
           "|:--|" + "--:|" * len(grid.columns)]
  for row in grid.rows:
    out = [cell(grid.cells[row, block]) if (row, block) in grid.cells else MISSING
           for block in grid.columns]
    lines.append(f"| {row.label} | " + " | ".join(out) + " |")
  return lines


def shift_map(grid: summaries.ShiftGrid | None) -> list[str]:
  if grid is None:
    return []
  return _shift_table(
      grid, "Key shift map (C9): gap / mean far accuracy by shift width and needle length",
      "Seeds averaged (n = seeds)",
      lambda c: f"{number(c.mean_gap)} / {number(c.mean_accuracy)} (n={c.seeds})")


def _counts(cell: summaries.ShiftCell) -> str:
  if any(c is None for c in cell.phase_dependent):
    return MISSING
  return (", ".join(str(n) for n, _ in cell.phase_dependent)
          + f" of {cell.phase_dependent[0][1]}")


def phase_dependent_map(grid: summaries.ShiftGrid | None) -> list[str]:
  """Per shift-map cell and seed, how many far-depth haystacks depend on the phase."""
  if grid is None or any(c.phase_dependent is None for c in grid.cells.values()):
    return []
  return _shift_table(
      grid, "Where the period lives (C9): far-depth haystacks whose needle accuracy depends "
      "on the phase", f"Per seed (seed order), haystacks whose accuracy by offset mod "
      f"{summaries.MAP_PERIOD} spans >= {PHASE_DEPENDENT} (found at some phases, missed at "
      "others); full attention shows the count without a chunk grid", _counts)


def sections(view: View) -> str:
  """Every table above, as one markdown block (empty when none applies)."""
  by_id = {c.id: c for c in view.claims}
  t = view.tables
  lines = (seed_table(t.seeds) + split_label_tables(t.split_labels, by_id.get("C5"))
           + slot_null_table(by_id.get("C6")) + chunk_phase_table(t.chunk_phases)
           + shift_map(t.shift_grid) + phase_dependent_map(t.shift_grid))
  return "\n".join(lines) + ("\n" if lines else "")
