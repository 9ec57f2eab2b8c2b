"""The studies' report hooks: what each study adds to a sweep's report.md and plots.

The engine renders the comparison table, the claims and verdict lines and the per-probe tables
of its own instruments; a study registers (``register``, when the studies are installed) the
figures its probes describe, the probe records it renders itself, and the parts of the report it
writes from the judged statistics (``View``). Hooks format only: every number they show is in
the records, the claims or the study's ``Judged.tables`` entry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.report import figures


@dataclasses.dataclass(frozen=True)
class View:
  """What a study's report hooks read."""

  records: Sequence[VariantRecord]
  claims: Sequence[Claim]
  tables: Any  # the study's ``Judged.tables`` entry (None when it has none)
  plots_dir: str
  directory: str  # the sweep directory (figures are linked relative to it)


@dataclasses.dataclass(frozen=True)
class ReportHooks:
  """A study's part of the report (module docstring); every hook is optional."""

  figures: Mapping[str, Callable[..., str]] = dataclasses.field(default_factory=dict)
  own_probes: tuple[str, ...] = ()  # probe records it renders itself (``probe_sections``)
  probe_sections: Callable[[Sequence[VariantRecord]], str] | None = None
  overview: Callable[[View], Mapping[str, str]] | None = None  # caption -> PNG, report's top
  summary: Callable[[View], list[str]] | None = None  # the summary's lines after the claims
  # the report's first lines: what the models are and the caveat a reviewer would raise
  regime: Callable[[View], list[str]] | None = None
  sections: Callable[[View], str] | None = None  # after the probe tables


HOOKS: dict[str, ReportHooks] = {}  # study -> its hooks, in the order the studies are installed


def register(study: str, hooks: ReportHooks) -> None:
  for kind, draw in hooks.figures.items():
    if figures.KINDS.get(kind, draw) is not draw:
      raise ValueError(f"figure kind {kind!r} of study {study!r} is registered already")
    figures.KINDS[kind] = draw
  HOOKS[study] = hooks


def own_probes() -> tuple[str, ...]:
  return tuple(name for hooks in HOOKS.values() for name in hooks.own_probes)


def views(records: Sequence[VariantRecord], claims: Sequence[Claim], tables: Mapping[str, Any],
          plots_dir: str, directory: str) -> dict[str, View]:
  return {study: View(records, claims, tables.get(study), plots_dir, directory)
          for study in HOOKS}
