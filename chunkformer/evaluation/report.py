"""Markdown report of a periodicity sweep: comparison table, per-variant sections, verdicts.

A *variant record* is a mapping: an ``analyze`` result merged with the sweep's own fields.
The table reads these keys (a missing key prints as "-"):
  variant (name), chunking (e.g. "fixed", "dynamic/router"), chunk_size (M, or the target mean
  chunk length of a dynamic variant), compression_ratio (achieved tokens per entry),
  far_accuracy (falls back to mean_accuracy), max_gap, periodic_share, detected_period,
  p_value.
Sections also use the interval fields of ``analyze``, ``by_chunk_size`` and ``images`` (caption
-> PNG path; written relative to the report). Claims are the caller's: verdict lines are
printed as given, so the sweep code, not this module, decides what the numbers support.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

_MISSING = "-"
# Header and record key of each table column.
TABLE_COLUMNS = (
    ("variant", "variant"),
    ("chunking", "chunking"),
    ("M / target", "chunk_size"),
    ("ratio", "compression_ratio"),
    ("far acc", "far_accuracy"),
    ("max gap", "max_gap"),
    ("periodic share", "periodic_share"),
    ("period", "detected_period"),
    ("p", "p_value"),
)
# Phase lists longer than this are left to the figure.
_MAX_LISTED_PHASES = 16


def _number(value: Any, spec: str) -> str:
  if value is None or (isinstance(value, float) and value != value):
    return _MISSING
  return format(value, spec)


def _p(value: Any) -> str:
  if value is None:
    return _MISSING
  return f"{value:.1e}" if value < 1e-3 else f"{value:.3f}"


def _cell(record: Mapping[str, Any], key: str) -> str:
  if key == "far_accuracy" and record.get(key) is None:
    key = "mean_accuracy"
  value = record.get(key)
  if key == "detected_period":
    return "none" if value is None and "detected_period" in record else _number(value, "d")
  if value is None:
    return _MISSING
  if key == "p_value":
    return _p(value)
  if key == "compression_ratio":
    return f"{value:.2f}x"
  if key == "chunk_size":
    return f"{value:g}"
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return str(value)
  return _number(value, "d" if isinstance(value, int) else ".3f")


def comparison_table(records: Sequence[Mapping[str, Any]]) -> str:
  """Aligned markdown table of the variants (TABLE_COLUMNS), readable on a console too."""
  header = [name for name, _ in TABLE_COLUMNS]
  rows = [[_cell(record, key) for _, key in TABLE_COLUMNS] for record in records]
  widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
  # Text columns left-aligned, numbers right-aligned.
  right = [i >= 2 for i in range(len(header))]

  def line(cells):
    padded = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)]
    return "| " + " | ".join(padded) + " |"

  rule = "|" + "|".join(("-" * (w + 1) + ":") if r else (":" + "-" * (w + 1))
                        for w, r in zip(widths, right, strict=True)) + "|"
  return "\n".join([line(header), rule, *(line(row) for row in rows)])


def _interval(record: Mapping[str, Any], key: str) -> str:
  value = record.get(key)
  if value is None:
    return _MISSING
  low, high = record.get(f"{key}_low"), record.get(f"{key}_high")
  if low is None or high is None:
    return f"{value:.3f}"
  return f"{value:.3f} [{low:.3f}, {high:.3f}]"


def _variant_section(record: Mapping[str, Any], directory: str) -> list[str]:
  name = record.get("variant", "variant")
  lines = [f"### {name}", ""]
  setup = [f"chunking: {record.get('chunking', _MISSING)}",
           f"M / target: {_cell(record, 'chunk_size')}",
           f"achieved compression: {_cell(record, 'compression_ratio')}"]
  if "num_haystacks" in record:
    setup.append(f"haystacks: {record['num_haystacks']}")
  lines += ["; ".join(setup), ""]
  conf = int(round(100 * record.get("confidence", 0.95)))
  phase_word = ("phase inside the actual chunk" if record.get("phase_source") == "caller"
                else "phase (offset mod M)")
  detected = record.get("detected_period")
  lines += [
      f"- mean accuracy: {_interval(record, 'mean_accuracy')} ({conf}% bootstrap)",
      f"- max gap over {phase_word}: {_interval(record, 'max_gap')}",
      f"- max gap over offsets (descriptive, biased up by noise): "
      f"{_number(record.get('offset_gap'), '.3f')}",
      f"- periodic share at M: {_cell(record, 'periodic_share')}, "
      f"p = {_p(record.get('p_value'))}",
      f"- detected period: {'none' if detected is None else detected} "
      f"(family-wise p = {_p(record.get('detection_p_value'))})",
  ]
  phases = record.get("phases")
  if phases is not None and len(phases) <= _MAX_LISTED_PHASES:
    values = record.get("accuracy_by_phase", [])
    listed = ", ".join(f"{p}: {_number(v, '.2f')}" for p, v in zip(phases, values, strict=True))
    lines.append(f"- accuracy by {phase_word}: {listed}")
  lines.append("")
  breakdown = record.get("by_chunk_size") or []
  if len(breakdown) > 1:
    lines += ["| M | max gap | weakest phase | periodic share | p |",
              "|--:|--:|--:|--:|--:|"]
    lines += [f"| {r['chunk_size']} | {_interval(r, 'max_gap')} | {r.get('weakest_phase')} "
              f"| {_number(r.get('periodic_share'), '.3f')} | {_p(r.get('p_value'))} |"
              for r in breakdown]
    lines.append("")
  for caption, path in (record.get("images") or {}).items():
    lines += [f"![{caption}]({_relative(path, directory)})", ""]
  return lines


def _relative(path: str, directory: str) -> str:
  return os.path.relpath(os.path.abspath(path), os.path.abspath(directory or ".")).replace(
      os.sep, "/")


def render_report(records: Sequence[Mapping[str, Any]], *, title: str,
                  verdicts: Sequence[str] = (), intro: str = "",
                  images: Mapping[str, str] | None = None, directory: str = ".") -> str:
  """The report as markdown text; image paths are made relative to ``directory``.

  Args:
    records: variant records (see module docstring), in table order.
    title: first heading.
    verdicts: claim lines decided by the caller, printed as a bullet list.
    intro: free text under the title (setup, commands).
    images: caption -> path of figures about the whole sweep (e.g. the comparison plot).
  """
  lines = [f"# {title}", ""]
  if intro:
    lines += [intro.strip(), ""]
  lines += ["## Comparison", "", comparison_table(records), "",
            "M / target: chunk size M, or the target mean chunk length of a dynamic variant; "
            "ratio: achieved tokens per compressed entry; max gap: max-min accuracy over phases; "
            "periodic share: variance over offsets explained by phase mod M (all 1/M harmonics); "
            "period: smallest significant period (family-wise); p: permutation test of the "
            "phase effect at M.", ""]
  for caption, path in (images or {}).items():
    lines += [f"![{caption}]({_relative(path, directory)})", ""]
  lines += ["## Verdicts", ""]
  lines += [f"- {verdict}" for verdict in verdicts] or ["- (none given)"]
  lines += ["", "## Variants", ""]
  for record in records:
    lines += _variant_section(record, directory)
  return "\n".join(lines).rstrip() + "\n"


def write_report(path, records: Sequence[Mapping[str, Any]], *, title: str,
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
