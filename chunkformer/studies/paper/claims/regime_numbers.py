"""The numbers a lookup sweep's regime paragraph states (``report/regime.py`` formats them):
what its units trained on, where its full-attention controls sit against the best strategy
that never reads the target's record (``data/lookup_shortcuts.py``), and its rows at ceiling.
Read from the records alone (the lookup probe's accuracy and stored shortcuts)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.stats import retrieval_gate
from chunkformer.studies.paper.claims import paper_rows as pr

PADDING = "prefix"


@dataclasses.dataclass(frozen=True)
class Regime:
  units: int  # units with a prefix lookup record
  tasks: tuple[str, ...]
  designs: tuple[tuple[int, int, bool], ...]  # (records, demonstrations, distinct values)
  full_means: tuple[float, ...]  # the full-attention units' prefix means (shortcut stored)
  full_below: int  # of them, less than the gate's margin above the shortcut
  shortcut: Mapping[str, Any] | None  # the full units' prefix shortcut record
  any_shortcut: bool  # some unit stores a shortcut
  ceiling: tuple[str, ...]  # rows with a unit at or above the ceiling


def regime(records: Sequence[VariantRecord]) -> Regime | None:
  """The regime of ``records`` (None without a prefix lookup record)."""
  units = [r for r in records if PADDING in (pr.lookup_modes(r) or {})]
  if not units:
    return None
  settings = [r.probes[pr.LOOKUP]["settings"] for r in units]
  designs = tuple(sorted({(s.get("num_records"), s.get("num_demos"),
                           bool(s.get("distinct_values"))) for s in settings}, key=str))
  known = [(r, s) for r in units if (s := pr.shortcut(r, PADDING)) is not None]
  full = [(r, s) for r, s in known if pr.is_full(r.setup)]
  means = tuple(pr.lookup_modes(r)[PADDING].mean for r, _ in full)
  shortcut = None
  if full:
    stored = full[0][0].probes[pr.LOOKUP]["shortcuts"]
    shortcut = next(stored[k] for k in pr.MATRIX_KEYS[PADDING] if k in stored)
  below = sum(retrieval_gate.within_margin(m, s) for (_, s), m in zip(full, means, strict=True))
  ceiling = tuple(sorted({r.setup.variant for r in units
                          if pr.lookup_modes(r)[PADDING].mean >= retrieval_gate.CEILING}))
  return Regime(len(units), tuple(sorted({r.setup.task for r in units})), designs, means,
                below, shortcut, bool(known), ceiling)
