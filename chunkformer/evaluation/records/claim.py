"""One claim's verdict as results.json stores it (``claims`` decides it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from chunkformer.evaluation.stats.seed_rule import VERDICTS


@dataclasses.dataclass(frozen=True)
class Claim:
  """One claim's verdict; results.json stores the list under ``claims``."""

  id: str
  statement: str
  verdict: str  # one of VERDICTS
  reason: str
  numbers: Mapping[str, Any]  # the numbers it rests on, per variant
  # e.g. "2/3": seeds agreeing with the verdict / seeds with data (INCONCLUSIVE: seeds in
  # which the claim holds)
  seeds_agreeing: str

  def __post_init__(self):
    if self.verdict not in VERDICTS:
      raise ValueError(f"claim {self.id}: verdict {self.verdict!r} is not one of {VERDICTS}")

  def to_json(self) -> dict[str, Any]:
    return {"id": self.id, "statement": self.statement, "verdict": self.verdict,
            "reason": self.reason, "numbers": dict(self.numbers),
            "seeds_agreeing": self.seeds_agreeing}

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> Claim:
    return cls(str(data["id"]), str(data["statement"]), str(data["verdict"]),
               str(data["reason"]), dict(data["numbers"]), str(data["seeds_agreeing"]))


def changed(claims: Sequence[Claim], other: Sequence[Claim]) -> dict[str, Claim | None]:
  """The claims of ``claims`` whose verdict or seed count differs in ``other`` (the same claims
  judged under other rules), by id, in ``claims``' order: the other verdict, or None where
  ``other`` lacks the claim."""
  by_id = {c.id: c for c in other}
  return {c.id: by_id.get(c.id) for c in claims if c.id not in by_id or (
      by_id[c.id].verdict, by_id[c.id].seeds_agreeing) != (c.verdict, c.seeds_agreeing)}
