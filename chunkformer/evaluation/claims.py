"""One verdict per claim of the study (C1-C9), from the verdict lines' judgments.

The claims, numbered as in issue 15 (DESIGN.md section 1 and 3):
  C1 fixed chunks of step M give an accuracy period of exactly M;
  C2 full attention shows no period (at >= 95% far accuracy);
  C3 removing RoPE keeps the period;  C4 uniform (mean) pooling keeps the period;
  C5 a smaller step hurts less: gap(M=2) < gap(M=4);
  C6 slot gains: heads prefer early or late phases of the chunk;
  C7 the '=' prefix probe on code models shows the period (N mod M);
  C8 content-defined (dynamic) chunk boundaries remove the periodic blind spot;
  C9 a key token shift (local mixing) removes it.
``verdicts.judge`` decides each claim for each trained model it can (True, False, or None =
inconclusive); ``build`` pools those per seed: a seed holds a claim when every decided judgment
of that seed holds, fails it when one fails. The claim is REPRODUCED / NOT REPRODUCED when at
least 2/3 of the decided seeds agree (1/1 with one seed), else INCONCLUSIVE, and INCONCLUSIVE
with the reason when the sweep has no data for it (never "NOT TESTED"). The seed rule is one
argument (``agreement``), so a seed-pooled test can replace it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

REPRODUCED = "REPRODUCED"
NOT_REPRODUCED = "NOT REPRODUCED"
INCONCLUSIVE = "INCONCLUSIVE"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)

STATEMENTS = {
    "C1": "fixed chunks of step M give an accuracy period of exactly M",
    "C2": "full attention shows no period",
    "C3": "removing RoPE keeps the period",
    "C4": "uniform (mean) pooling instead of the learned gate keeps the period",
    "C5": "a smaller step hurts less: gap(M=2) < gap(M=4)",
    "C6": "slot gains: heads prefer early or late phases of the chunk",
    "C7": "the '=' prefix probe on code models shows the period (prefix length N mod M)",
    "C8": "content-defined (dynamic) chunk boundaries remove the periodic blind spot in "
          "absolute position",
    "C9": "a key token shift (local mixing) removes the periodic blind spot",
}
CLAIM_IDS = tuple(STATEMENTS)
# Why a claim without any judgment has no verdict.
_NO_DATA = {
    "C1": "no plain fixed variant in the sweep",
    "C2": "no full-attention variant in the sweep",
    "C3": "no fixed variant with RoPE off in the sweep",
    "C4": "no fixed variant with uniform (mean) pooling in the sweep",
    "C5": "needs plain fixed M=2 and M=4 with the same needles and seed",
    "C6": "slot gains are not judged against a null yet (the same statistic at initialisation "
          "and under permutation of slots)",
    "C7": "no plain fixed code-model variant (task=code) with the prefix probe in the sweep",
    "C8": "no dynamic-chunking variant without key shift in the sweep",
    "C9": "no key-shift compressed variant in the sweep",
}


@dataclasses.dataclass(frozen=True)
class Claim:
  """One claim's verdict; results.json stores the list under ``claims``."""

  id: str
  statement: str
  verdict: str  # one of VERDICTS
  reason: str
  numbers: Mapping[str, Any]  # the numbers it rests on, per variant
  seeds_agreeing: str  # e.g. "2/3": seeds agreeing with the verdict / seeds with data

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


# seed -> True (holds) / False (fails) / None (undecided)  ->  (verdict, seeds agreeing, note)
Agreement = Callable[[Mapping[int, bool | None]], tuple[str, str, str]]


def majority_of_seeds(per_seed: Mapping[int, bool | None]) -> tuple[str, str, str]:
  """REPRODUCED / NOT REPRODUCED when >= 2/3 of the decided seeds agree, else INCONCLUSIVE."""
  holds = sum(v is True for v in per_seed.values())
  fails = sum(v is False for v in per_seed.values())
  decided, total = holds + fails, len(per_seed)
  if decided == 0:
    return INCONCLUSIVE, f"0/{total}", "no seed decides it"
  if 3 * holds >= 2 * decided:
    return REPRODUCED, f"{holds}/{total}", ""
  if 3 * fails >= 2 * decided:
    return NOT_REPRODUCED, f"{fails}/{total}", ""
  return INCONCLUSIVE, f"{max(holds, fails)}/{total}", f"seeds disagree ({holds} hold, " \
      f"{fails} fail)"


def _key(judgment, used: set[str]) -> str:
  names = "+".join(r.name for r in judgment.records[:1]) or "sweep"
  key, n = names, 1
  while key in used:
    n += 1
    key = f"{names}#{n}"
  used.add(key)
  return key


def build(judgments: Sequence[Any], *, agreement: Agreement = majority_of_seeds,
          extra: Mapping[str, Claim] | None = None) -> list[Claim]:
  """The claims C1-C9 from ``verdicts.judge``'s judgments (module docstring).

  Args:
    judgments: ``verdicts.Judgment``s (line, claim, holds, records, numbers, reason).
    agreement: the seed rule (``majority_of_seeds``).
    extra: claims decided elsewhere (e.g. a slot-gain null test for C6), replacing the
      judgment-based ones with the same id.
  """
  claims = []
  for claim_id in CLAIM_IDS:
    if extra and claim_id in extra:
      claims.append(extra[claim_id])
      continue
    mine = [j for j in judgments if j.claim == claim_id and j.records]
    if not mine:
      untested = next((j.reason for j in judgments if j.claim == claim_id), None)
      claims.append(Claim(claim_id, STATEMENTS[claim_id], INCONCLUSIVE,
                          untested or _NO_DATA[claim_id], {}, "0/0"))
      continue
    per_seed: dict[int, bool | None] = {}
    for j in mine:
      seed = j.records[0].setup.seed
      before = per_seed.get(seed)
      if j.holds is False or before is False:
        per_seed[seed] = False
      elif j.holds is True or before is True:
        per_seed[seed] = True
      else:
        per_seed[seed] = None
    verdict, agreeing, note = agreement(per_seed)
    used: set[str] = set()
    numbers = {_key(j, used): dict(j.numbers, holds=j.holds) for j in mine}
    reasons = sorted({f"{j.records[0].name}: {j.reason}" for j in mine if j.reason})
    decided = [j for j in mine if j.holds is not None]
    needles = sorted({(j.records[0].setup.key_len, j.records[0].setup.value_len)
                      for j in mine})
    summary = (f"holds in {sum(j.holds is True for j in decided)} of {len(decided)} decided "
               f"tests ({len(mine) - len(decided)} undecided); needle key/value tokens "
               + ", ".join(f"{k}/{v}" for k, v in needles))
    reason = "; ".join(x for x in [note, summary, *reasons] if x)
    claims.append(Claim(claim_id, STATEMENTS[claim_id], verdict, reason, numbers, agreeing))
  return claims
