"""One claim's verdict as results.json stores it (``claims`` decides it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
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
