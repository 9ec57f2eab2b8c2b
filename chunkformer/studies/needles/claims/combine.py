"""One verdict per claim of the study (C1-C9), from the verdict lines' judgments.

The claims, numbered C1-C9 as in docs/claims.md (docs/design.md sections 1 and 3):
  C1 fixed chunks of step M give an accuracy period of exactly M;
  C2 full attention shows no period (at >= 95% far accuracy);
  C3 removing RoPE keeps the period;  C4 uniform (mean) pooling keeps the period;
  C5 a smaller step hurts less: gap(M=2) < gap(M=4);
  C6 slot gains: heads prefer early or late phases of the chunk;
  C7 the '=' prefix probe on code models shows the period (N mod M);
  C8 content-defined (dynamic) chunk boundaries remove the periodic blind spot;
  C9 a key token shift (local mixing) removes it.
``judgments.judge`` decides each claim for each trained model it can (True, False, or None =
undecided, e.g. the task not learned), and again for each variant's seed-pooled record
(``seed_pooling``: its seeds' haystacks pooled as the claim rules say). ``from_judgments``
applies the one seed rule (``stats.seed_rule``) per variant: REPRODUCED when the claim holds in
at least ``rules.min_agree(n)`` of its n seeds (the current rules: 2, never one; version 1:
min(2, n)) AND in the seed-pooled test, NOT REPRODUCED when it fails in enough seeds AND in the
pooled test, else INCONCLUSIVE with the reason (a variant with one seed is its own pooled
test). Over the variants a claim rests on: the common verdict of the variants that decide it
(the undecided ones named in the reason), INCONCLUSIVE when they disagree or none decides, and
INCONCLUSIVE with the reason when the sweep has no data for it (never "NOT TESTED").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.stats.seed_rule import (
  INCONCLUSIVE,
  SeedAgreement,
  common_verdict,
  seed_agreement,
)

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


def _fold(judgments: Sequence[Any]) -> bool | None:
  """Several judgments of one model: fails if one fails, holds if one holds, else undecided."""
  found = [j.holds for j in judgments]
  return False if False in found else True if True in found else None


def _variant(judgment) -> str:
  return judgment.records[0].setup.variant


def _key(judgment, used: set[str]) -> str:
  names = "+".join(r.name for r in judgment.records[:1]) or "sweep"
  key, n = names, 1
  while key in used:
    n += 1
    key = f"{names}#{n}"
  used.add(key)
  return key


def _variant_rule(mine: Sequence[Any], pooled: Sequence[Any] | None,
                  rules: claim_rules.Rules) -> SeedAgreement:
  """The seed rule for one variant's judgments of one claim and its pooled judgments."""
  per_seed: dict[int, list] = {}
  for j in mine:
    per_seed.setdefault(j.records[0].setup.seed, []).append(j)
  holds = [_fold(js) for _, js in sorted(per_seed.items())]
  if pooled is None:  # several seeds without correctness matrices: no pooled test exists
    rule = seed_agreement(holds, None, min_agree=rules.min_agree(len(holds)))
    return dataclasses.replace(rule, reason="no seed-pooled test (correctness matrices not "
                               "stored)")
  return seed_agreement(holds, _fold(pooled), min_agree=rules.min_agree(len(holds)))


def from_judgments(claim_id: str, judgments: Sequence[Any],
                   pooled: Sequence[Any] | None = None,
                   rules: claim_rules.Rules = claim_rules.CURRENT_RULES) -> Claim:
  """One claim (``claim_id``) from ``judgments.judge``'s judgments (module docstring), under
  ``rules`` (default: the current claim rules).

  Args:
    judgments: ``judgments.Judgment``s of the trained models (line, claim, holds, records,
      numbers, reason).
    pooled: the judgments of the variants' seed-pooled records (``pooling``); a variant
      with several seeds and no pooled judgment of the claim has no pooled test.
  """
  pooled = list(pooled or ())
  pooled_variants = {_variant(j) for j in pooled if j.records}
  mine = [j for j in judgments if j.claim == claim_id and j.records]
  if not mine:
    untested = next((j.reason for j in judgments if j.claim == claim_id), None)
    return Claim(claim_id, STATEMENTS[claim_id], INCONCLUSIVE, untested or _NO_DATA[claim_id],
                 {}, "0/0")
  by_variant: dict[str, list] = {}
  for j in mine:
    by_variant.setdefault(_variant(j), []).append(j)
  multi_seed = {v for v, js in by_variant.items()
                if len({j.records[0].setup.seed for j in js}) > 1}
  seed_rules = {}
  for variant, js in by_variant.items():
    theirs = [p for p in pooled if p.claim == claim_id and p.records and _variant(p) == variant]
    if not theirs and variant not in multi_seed:
      theirs = js  # one seed: its own test is the pooled test
    elif not theirs and variant not in pooled_variants:
      theirs = None  # several seeds without a pooled record: no pooled test exists
    seed_rules[variant] = _variant_rule(js, theirs, rules)
  verdict, note = common_verdict({v: r.verdict for v, r in seed_rules.items()}, "variants")
  if verdict == INCONCLUSIVE:  # no verdict to agree with: the seeds in which it holds
    agreeing = (f"{sum(r.holds for r in seed_rules.values())}/"
                f"{sum(r.seeds for r in seed_rules.values())}")
  else:
    counted = [r for r in seed_rules.values() if r.verdict == verdict]
    agree = sum(r.agreeing_seeds for r in counted)
    agreeing = f"{agree}/{sum(r.seeds for r in counted)}"
  used: set[str] = set()
  numbers: dict[str, Any] = {_key(j, used): dict(j.numbers, holds=j.holds) for j in mine}
  for p in pooled:
    if p.claim == claim_id and p.records and _variant(p) in multi_seed:
      numbers[_key(p, used)] = dict(p.numbers, holds=p.holds)
  numbers["seed_rule"] = {v: r.record() for v, r in sorted(seed_rules.items())}
  per_variant = "; ".join(_variant_summary(v, r) for v, r in sorted(seed_rules.items()))
  reasons = sorted({f"{j.records[0].name}: {j.reason}" for j in mine if j.reason})
  needles = sorted({(j.records[0].setup.key_len, j.records[0].setup.value_len)
                    for j in mine})
  summary = "needle key/value tokens " + ", ".join(f"{k}/{v}" for k, v in needles)
  reason = "; ".join(x for x in [note, per_variant, summary, *reasons] if x)
  return Claim(claim_id, STATEMENTS[claim_id], verdict, reason, numbers, agreeing)


def _variant_summary(variant: str, rule: SeedAgreement) -> str:
  if rule.seeds == 1:  # its own test is the pooled test; the judgment's reason follows
    return f"{variant}: {rule.verdict} (1 seed" + (f": {rule.reason})" if rule.reason else ")")
  pooled = ("undecided" if rule.pooled_holds is None else
            "holds" if rule.pooled_holds else "fails")
  return (f"{variant}: {rule.verdict}, holds in {rule.count} seeds, seed-pooled test "
          f"{pooled}" + (f" ({rule.reason})" if rule.reason else ""))
