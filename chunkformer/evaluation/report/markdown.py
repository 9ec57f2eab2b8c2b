"""Markdown report of a periodicity sweep: a summary (the claims' verdicts, comparison table,
main figure), then the claims with their reasons, the settings, the verdict lines and the
per-variant sections.

Reads typed ``records.variant.VariantRecord``s. The table shows per variant: its name, chunking
(e.g. "fixed", "dynamic/router"), M / target (chunk size M, or the target mean chunk length of a
dynamic variant), the achieved compression ratio (tokens per entry), far accuracy (the primary
probe's mean accuracy: a needle counts when its whole answer is right), the max gap over phases,
the periodic share, the detected period, the permutation p-value at M, and two per-token
accuracies: the probe's (fraction of answer tokens right) and the training run's held-out far
accuracy (the accuracy gates'). With multi-token values the needle accuracy is well below the
token ones (2 value tokens: both must be right). Sections add the intervals, ``by_chunk_size``
and the figures (caption -> PNG path; written relative to the report). Claims are the
caller's: verdict lines and the claim table are printed as given, so the sweep code, not this
module, decides what the numbers support.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence

from chunkformer.evaluation.records.claim import Claim, changed
from chunkformer.evaluation.records.formatting import MISSING, number, p_value
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.stats.analysis_types import Interval
from chunkformer.evaluation.stats.seed_rule import INCONCLUSIVE


def _ratio(value: float | None) -> str:
  return MISSING if value is None else f"{value:.2f}x"


def _size(value: int | None) -> str:
  return MISSING if value is None else f"{value:g}"


# Header and cell of each table column.
TABLE_COLUMNS: tuple[tuple[str, Callable[[VariantRecord], str]], ...] = (
    ("variant", lambda r: r.name),
    ("chunking", lambda r: r.setup.chunking),
    ("M / target", lambda r: _size(r.chunk_size)),
    ("ratio", lambda r: _ratio(r.compression_ratio)),
    ("far acc", lambda r: number(r.far_accuracy, ".3f")),
    ("max gap", lambda r: number(r.analysis.max_gap, ".3f")),
    ("periodic share", lambda r: number(r.analysis.periodic_share, ".3f")),
    ("period", lambda r: "none" if r.analysis.detected_period is None
     else str(r.analysis.detected_period)),
    ("p", lambda r: p_value(r.analysis.p_value)),
    ("far token acc", lambda r: number(r.far_token_accuracy, ".3f")),
    ("held-out far", lambda r: number(r.heldout_far_accuracy, ".3f")),
)
# Phase lists longer than this are left to the figure.
_MAX_LISTED_PHASES = 16


def comparison_table(records: Sequence[VariantRecord]) -> str:
  """Aligned markdown table of the variants (TABLE_COLUMNS), readable on a console too."""
  header = [name for name, _ in TABLE_COLUMNS]
  rows = [[cell(record) for _, cell in TABLE_COLUMNS] for record in records]
  widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
  # Text columns left-aligned, numbers right-aligned.
  right = [i >= 2 for i in range(len(header))]

  def line(cells):
    padded = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)]
    return "| " + " | ".join(padded) + " |"

  rule = "|" + "|".join(("-" * (w + 1) + ":") if r else (":" + "-" * (w + 1))
                        for w, r in zip(widths, right, strict=True)) + "|"
  return "\n".join([line(header), rule, *(line(row) for row in rows)])


def _interval(estimate: Interval | None) -> str:
  if estimate is None or estimate.value is None:
    return MISSING
  if estimate.low is None or estimate.high is None:
    return f"{estimate.value:.3f}"
  return f"{estimate.value:.3f} [{estimate.low:.3f}, {estimate.high:.3f}]"


def _variant_section(record: VariantRecord, directory: str) -> list[str]:
  a = record.analysis
  lines = [f"### {record.name}", ""]
  setup = [f"chunking: {record.setup.chunking}",
           f"M / target: {_size(record.chunk_size)}",
           f"achieved compression: {_ratio(record.compression_ratio)}",
           f"haystacks: {a.num_haystacks}"]
  lines += ["; ".join(setup), ""]
  conf = int(round(100 * a.confidence))
  phase_word = ("phase inside the actual chunk" if a.phase_source == "caller"
                else "phase (offset mod M)")
  lines += [
      f"- mean accuracy: {_interval(a.mean_accuracy)} ({conf}% bootstrap)",
      f"- max gap over {phase_word}: {_interval(a.phase.gap)}",
      f"- max gap over offsets (descriptive, biased up by noise): "
      f"{number(a.offset_gap, '.3f')}",
      f"- periodic share at M: {number(a.periodic_share, '.3f')}, p = {p_value(a.p_value)}",
      f"- detected period: {'none' if a.detected_period is None else a.detected_period} "
      f"(family-wise p = {p_value(a.detection_p_value)})",
  ]
  phases = a.phase.phases
  if len(phases) <= _MAX_LISTED_PHASES:
    listed = ", ".join(f"{p}: {number(v, '.2f')}"
                       for p, v in zip(phases, a.phase.accuracy.values, strict=True))
    lines.append(f"- accuracy by {phase_word}: {listed}")
  lines.append("")
  if len(a.by_chunk_size) > 1:
    lines += ["Weakest phase in parentheses: only the lowest, its band overlaps another "
              "phase's.", "", "| M | max gap | weakest phase | periodic share | p |",
              "|--:|--:|--:|--:|--:|"]
    lines += [f"| {t.chunk_size} | {_interval(t.table.gap)} | {t.table.weakest_label()} "
              f"| {number(t.periodic_share, '.3f')} | {p_value(t.p_value)} |"
              for t in a.by_chunk_size]
    lines.append("")
  for caption, path in record.images.items():
    lines += [f"![{caption}]({_relative(path, directory)})", ""]
  return lines


def untested(claim: Claim) -> bool:
  """No unit of the sweep bears on the claim: INCONCLUSIVE with no seed counted."""
  return claim.verdict == INCONCLUSIVE and claim.seeds_agreeing == "0/0"


def _untested_line(ids: Sequence[str]) -> str:
  return (f"Not tested by this sweep (no unit bears on them; reasons under \"Claims in full\"): "
          f"{', '.join(ids)}.")


def claims_table(claims: Sequence[Claim]) -> str:
  """One row per claim the sweep tests: id, verdict, seeds agreeing, statement (the summary's
  table; the reasons follow the summary, ``claims_in_full``); the untested ones named in one
  line after it."""
  tested = [c for c in claims if not untested(c)]
  lines = []
  if tested:
    lines = ["| claim | verdict | seeds agreeing | statement |", "|:--|:--|--:|:--|"]
    lines += [f"| {c.id} | {c.verdict} | {c.seeds_agreeing} | {c.statement} |" for c in tested]
  rest = [c.id for c in claims if untested(c)]
  if rest:
    lines += ([""] if lines else []) + [_untested_line(rest)]
  return "\n".join(lines)


def claims_in_full(claims: Sequence[Claim]) -> list[str]:
  """Every claim's verdict with its whole reason: the test, the rows and their numbers."""
  return ["## Claims in full", "",
          *(f"- **{c.id}** {c.verdict} ({c.seeds_agreeing} seeds agreeing): {c.statement}; "
            f"{c.reason}" for c in claims), ""]


@dataclasses.dataclass(frozen=True)
class RulesChange:
  """The claim rules that decide a sweep's verdicts, when they are older than the current
  ones: their versions, the current rules' verdicts, and what changed and why."""

  deciding: str  # version that decides (the sweep's own)
  deciding_written: str
  current: str
  current_written: str
  changes: Sequence[tuple[str, str]]  # (what changed, why)
  current_claims: Sequence[Claim]


def rules_section(change: RulesChange, claims: Sequence[Claim]) -> list[str]:
  """Each claim's verdict under the sweep's own rules and under the current ones, the changes
  and why, and the current rules' reason for every claim whose verdict or seed count differs."""
  now = {c.id: c for c in change.current_claims}
  lines = [f"### Verdicts under the current claim rules (version {change.current}, "
           f"{change.current_written})", "",
           f"The verdicts above are decided by the rules these results were judged under "
           f"(version {change.deciding}, {change.deciding_written}). The rules changed after "
           f"these results were seen."]
  moved = changed(claims, change.current_claims)
  if moved:
    lines[-1] += (" Under the current rules (the claims whose verdict or seed count differs; "
                  "every other claim has the same under both):")
    lines += ["", f"| claim | version {change.deciding} | version {change.current} | "
              "seeds agreeing |", "|:--|:--|:--|--:|"]
    for c in (c for c in claims if c.id in moved):
      other = moved[c.id]
      lines.append(f"| {c.id} | {c.verdict} | {other.verdict if other else '-'} | "
                   f"{other.seeds_agreeing if other else '-'} |")
  else:
    lines[-1] += " Every claim has the same verdict and seed count under the current rules."
  lines += ["", "What changed, and why:", ""]
  lines += [f"- {what}: {why}." for what, why in change.changes]
  differing = [now[c.id] for c in claims if c.id in now and c.id in moved]
  if differing:
    lines += ["", "Where the verdict or the seed count differs, the current rules' reason:", ""]
    lines += [f"- {c.id} {c.verdict} ({c.seeds_agreeing}): {c.reason}" for c in differing]
  return lines


def _relative(path: str, directory: str) -> str:
  return os.path.relpath(os.path.abspath(path), os.path.abspath(directory or ".")).replace(
      os.sep, "/")


def render_report(records: Sequence[VariantRecord], *, title: str,
                  verdicts: Sequence[str] = (), intro: str = "",
                  images: Mapping[str, str] | None = None, directory: str = ".",
                  claims: Sequence[Claim] = (), summary: Sequence[str] = (),
                  rules: RulesChange | None = None, regime: Sequence[str] = ()) -> str:
  """The report as markdown text; image paths are made relative to ``directory``.

  Args:
    records: variant records (see module docstring), in table order.
    title: first heading.
    verdicts: claim lines decided by the caller, printed as a bullet list.
    intro: free text under the title (setup, commands).
    images: caption -> path of figures about the whole sweep (e.g. the comparison plot).
    claims: the claims (``claims.judge``): their verdicts are the summary's first part, their
      reasons a section after the summary.
    summary: markdown lines the summary shows after the claims (the plan, the paper-style
      table and its comparison lines, ``paper_table``).
    rules: the claims under the current rules, when older rules decide (``rules_section``).
    regime: lines under the title, before the summary (what the models are, the caveat).
  """
  # A summary a reader can stop after (the claims' verdicts, the table, the main figure); the
  # claims' reasons, the settings, the verdict lines and the per-variant detail follow it.
  lines = [f"# {title}", "", *regime, "## Summary", ""]
  if claims:
    lines += [claims_table(claims), ""]
  if claims and rules is not None:
    lines += [*rules_section(rules, claims), ""]
  if summary:
    lines += [*summary, ""]
  lines += [comparison_table(records), "",
            "M / target: chunk size M, or the target mean chunk length of a dynamic variant; "
            "ratio: achieved tokens per compressed entry; max gap: max-min accuracy over phases; "
            "periodic share: variance over offsets explained by phase mod M (all 1/M harmonics); "
            "period: smallest significant period (family-wise); p: permutation test of the "
            "phase effect at M.", ""]
  for caption, path in (images or {}).items():
    lines += [f"![{caption}]({_relative(path, directory)})", ""]
  if claims:
    lines += claims_in_full(claims)
  if intro:
    lines += ["## Settings", "", intro.strip(), ""]
  lines += ["## Verdicts", ""]
  lines += [f"- {verdict}" for verdict in verdicts] or ["- (none given)"]
  lines += ["", "## Variants", ""]
  for record in records:
    lines += _variant_section(record, directory)
  return "\n".join(lines).rstrip() + "\n"


def write_report(path, records: Sequence[VariantRecord], *, title: str,
                 verdicts: Sequence[str] = (), intro: str = "",
                 images: Mapping[str, str] | None = None) -> str:
  """Writes ``render_report`` to ``path`` (folders created); returns the path."""
  path = os.fspath(path)
  directory = os.path.dirname(path) or "."
  os.makedirs(directory, exist_ok=True)
  text = render_report(records, title=title, verdicts=verdicts, intro=intro, images=images,
                       directory=directory)
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
  return path
