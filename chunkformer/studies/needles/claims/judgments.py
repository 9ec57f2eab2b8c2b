"""Each claim judged per trained model: the verdict lines and their ``Judgment``s.

Judged here (docs/design.md section 1, docs/claims.md), each only where the sweep has the
variants; the seed rule over a variant's seeds is ``combine``'s:
- C1 (C7 for a code model's prefix probe): fixed chunks of step M show accuracy period exactly
  M: detected period = M and p < 0.01;
- C2: full attention shows no period: p > 0.05 (at the reference M) and no detected period
  at any candidate period (``no_period``), with far accuracy >= 95%;
- C3 / C4: removing RoPE, or replacing the learned gate by a plain average, keeps the period
  (p < 0.01 at M); the line says "one seed" where the variant has one;
- C5: a smaller step hurts less: gap(M = 2) < gap(M = 4) (where the stored matrices allow,
  the paired test of ``tested`` decides instead);
- C8 / C9 (cures: dynamic chunking; a key shift; staggered or random phases and overlap are
  reported without a claim): their gap and far accuracy against the plain fixed model at the
  same budget (M = the cure's chunk size or target) and the same needle lengths; a cure has no
  period by C2's standard (``no_period``) at the far depth AND with all depths pooled, else it
  is still periodic. Against a baseline below 50% far accuracy (the task not learned) the
  comparison is reported as inconclusive. The haystack-level test (``Adjusted``) is reported
  beside each cure and judged as an alternative (``holds_haystack``), not deciding.
The p-values a judgment reads are Holm-adjusted within its claim where ``judge`` is given them
(``Adjusted``; ``holm_family`` says which tests form the family).
A plain fixed model: fixed chunks, RoPE on, gated pooling, no overlap, no stagger, no random
phase, no key shift. The accuracy gates (95% for full attention, 50% for "the task was learned")
read the held-out far accuracy of the training run where recorded (``gate_accuracy``).
Verdict lines start with REPRODUCED, NOT REPRODUCED, INCONCLUSIVE (a full
model without a period but below the accuracy gate; "INCONCLUSIVE (no data)" for a claim the
sweep has no variant for) or CURE.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from chunkformer.evaluation.claims import seed_pooling
from chunkformer.evaluation.claims.standards import (
  FULL_ACCURACY,
  LEARNED_ACCURACY,
  NULL_ALPHA,
  PERIOD_ALPHA,
  far_accuracy,
  gate_accuracy,
  is_code_model,
  no_period,
)
from chunkformer.evaluation.records.formatting import interval, number, p_value
from chunkformer.evaluation.records.variant import VariantRecord

Record = VariantRecord


@dataclasses.dataclass(frozen=True)
class Adjusted:
  """A record's phase tests as its claim reads them (``registry.evidence`` computes them).

  ``far``/``all_depths``: the Holm-adjusted p-values at M within the claim's family (None: the
  record is not in the family, its own p-value stands); ``family``: the number of tests in
  it. ``haystack_far``/``haystack_all_depths``: the haystack-level test
  (``stats.haystack_test``) of the same rows, reported beside the offset-level test.
  """

  far: float | None = None
  all_depths: float | None = None
  family: int = 0
  haystack_far: float | None = None
  haystack_all_depths: float | None = None


NO_ADJUSTMENT = Adjusted()


@dataclasses.dataclass(frozen=True)
class Judgment:
  """One verdict line and what it says about one claim (``claims``) for one trained model.

  ``holds`` is True or False when the line decides the claim for its model, None when the
  evidence is inconclusive (the task not learned, no baseline); ``records`` are the models
  the line rests on (the first gives the seed).
  """

  line: str
  claim: str | None  # "C1".."C9"; None for a line that no claim counts (e.g. a stagger cure)
  holds: bool | None
  records: tuple[Record, ...]
  numbers: dict[str, Any]
  reason: str = ""


def _lengths(r: Record) -> tuple[int, int]:
  return r.setup.key_len, r.setup.value_len


def needle_block(r: Record) -> tuple[int, int, int]:
  """(key tokens, value tokens, training steps): the models a comparison pairs. A study trains
  each needle length at its own budget and may train one again longer (the study: C5 on 2-token
  needles at 3000 and 4000 steps); models of different budgets are not paired."""
  return r.setup.key_len, r.setup.value_len, r.trained_steps


def _needle(r: Record) -> str:
  if is_code_model(r):
    return "code needles, prefix probe"
  key, value = _lengths(r)
  return f"key {key}/value {value} token{'s' if max(key, value) > 1 else ''}"


def is_plain_fixed(r: Record) -> bool:
  return r.setup.is_plain_fixed


def _is_ablation(r: Record) -> bool:
  """Fixed, no cure switched on, but RoPE off or a different seed_pooling."""
  s = r.setup
  return (s.attention == "fixed" and not s.overlaps and not s.stagger and not s.random_phase
          and not s.key_shift and not is_plain_fixed(r))


def is_cure(r: Record) -> bool:
  s = r.setup
  return s.attention == "dynamic" or (s.attention == "fixed" and (
      s.overlaps or s.stagger or s.random_phase or s.key_shift))


def _period(value: int | None) -> str:
  return str(value) if value is not None else "none"


def _core_numbers(r: Record, adjusted: Adjusted = NO_ADJUSTMENT) -> dict[str, Any]:
  a = r.analysis
  out = {"variant": r.name, "seed": r.setup.seed, "chunk_size": a.chunk_size,
         "detected_period": a.detected_period, "p_value": a.p_value, "max_gap": a.max_gap,
         "max_gap_low": a.phase.gap.low, "max_gap_high": a.phase.gap.high,
         "far_accuracy": far_accuracy(r), "gate_accuracy": gate_accuracy(r)[0]}
  if adjusted.far is not None:
    out.update(p_value_holm=adjusted.far, holm_family=adjusted.family)
  return out


def _p(r: Record, adjusted: Adjusted) -> float | None:
  """The far-depth p-value at M the judgment reads: Holm-adjusted where the record is in its
  claim's family."""
  return r.analysis.p_value if adjusted.far is None else adjusted.far


def _p_text(r: Record, adjusted: Adjusted) -> str:
  text = f"p = {p_value(r.analysis.p_value)}"
  if adjusted.far is not None:
    tests = "test" if adjusted.family == 1 else "tests"
    text += f" (Holm over {adjusted.family} {tests} of the claim: {p_value(adjusted.far)})"
  return text


def _learned(r: Record) -> bool:
  gate, _ = gate_accuracy(r)
  return gate is not None and gate >= LEARNED_ACCURACY


def _period_claim(r: Record, adjusted: Adjusted = NO_ADJUSTMENT) -> Judgment:
  a = r.analysis
  m, period, p = r.chunk_size, a.detected_period, _p(r, adjusted)
  ok = period == m and p is not None and p < PERIOD_ALPHA
  head = "REPRODUCED" if ok else "NOT REPRODUCED"
  gate, gate_name = gate_accuracy(r)
  caution = ("" if gate is None or gate >= LEARNED_ACCURACY else
             f"; caution: {gate_name} {number(gate)} < {LEARNED_ACCURACY}, the task is barely "
             "learned")
  line = (f"{head}: period = M for fixed M={m} ({r.name}, {_needle(r)}): detected period "
          f"{_period(period)}, {_p_text(r, adjusted)} at M (need period {m} and "
          f"p < {PERIOD_ALPHA}); max gap {number(a.max_gap)}, {a.phase.weakest_text()}"
          f"{caution}")
  holds = ok if ok or _learned(r) else None
  claim = "C7" if is_code_model(r) else "C1"  # code: the '=' prefix probe (primary)
  return Judgment(line, claim, holds, (r,), _core_numbers(r, adjusted),
                  "" if holds is not None else "the task was not learned")


def _full_claim(r: Record, adjusted: Adjusted = NO_ADJUSTMENT) -> Judgment:
  a = r.analysis
  p, period, far = _p(r, adjusted), a.detected_period, far_accuracy(r)
  gate, gate_name = gate_accuracy(r)
  periodic = not no_period(p, period)
  ok = not periodic and gate is not None and gate >= FULL_ACCURACY
  holds = ok or (False if periodic else None)  # no period but below the accuracy gate: open
  head = "REPRODUCED" if ok else ("INCONCLUSIVE" if holds is None else "NOT REPRODUCED")
  line = (f"{head}: full attention has no period ({r.name}, {_needle(r)}): "
          f"{_p_text(r, adjusted)} at M={a.chunk_size}, "
          f"detected period {_period(period)}, far accuracy {number(far)}"
          + (f", {gate_name} {number(gate)}" if gate_name != "far accuracy" else "")
          + f" (need p > {NULL_ALPHA}, no period, {gate_name} >= {FULL_ACCURACY})")
  reason = "" if holds is not None else (
      f"no period, but {gate_name} {number(gate)} is below the {FULL_ACCURACY} gate")
  return Judgment(line, "C2", holds, (r,), _core_numbers(r, adjusted), reason)


def _ablation_claim(r: Record, adjusted: Adjusted = NO_ADJUSTMENT, *,
                    one_seed: bool = False) -> Judgment:
  what = []
  if not r.setup.rope:
    what.append("RoPE off")
  if r.setup.pooling != "gated":
    what.append(f"pooling {r.setup.pooling}")
  a = r.analysis
  p, period, m = _p(r, adjusted), a.detected_period, r.chunk_size
  ok = p is not None and p < PERIOD_ALPHA
  head = ("REPRODUCED" if ok else "NOT REPRODUCED") + (" on one seed" if one_seed else "")
  line = (f"{head}: still periodic with {', '.join(what)} ({r.name}, M={m}, {_needle(r)}): "
          f"{_p_text(r, adjusted)} at M, detected period {_period(period)}, "
          f"max gap {number(a.max_gap)} (need p < {PERIOD_ALPHA})")
  holds = ok if ok or _learned(r) else None
  return Judgment(line, "C3" if not r.setup.rope else "C4", holds, (r,),
                  dict(_core_numbers(r, adjusted), one_seed=one_seed),
                  "" if holds is not None else "the task was not learned")


def _gap_claims(plain: Sequence[Record]) -> list[Judgment]:
  out = []
  by_group: dict[tuple[int, int, int, int], dict[int, Record]] = {}
  for r in plain:
    if r.setup.task == "kv":  # C5 asks about needle retrieval
      by_group.setdefault((*needle_block(r), r.setup.seed), {}).setdefault(r.chunk_size, r)
  for _, by_m in sorted(by_group.items()):
    if 2 in by_m and 4 in by_m:
      a, b = by_m[2], by_m[4]
      ga, gb = a.analysis.phase.gap, b.analysis.phase.gap
      ok = ga.value is not None and gb.value is not None and ga.value < gb.value
      separated = ok and ga.high is not None and gb.low is not None and ga.high < gb.low
      reverse = (not ok and None not in (ga.low, gb.high) and gb.high < ga.low)
      significant = separated or reverse
      # The word follows the intervals, as the claim's does: a point difference inside
      # overlapping intervals is not a finding either way.
      word = ("REPRODUCED" if separated else "NOT REPRODUCED" if reverse else
              f"INCONCLUSIVE ({'the predicted' if ok else 'the opposite'} order, intervals "
              "overlap)")
      line = (f"{word}: gap(M=2) < gap(M=4) "
              f"({_needle(a)}): {interval(ga.value, ga.low, ga.high)} "
              f"({a.name}) vs "
              f"{interval(gb.value, gb.low, gb.high)} ({b.name})"
              f"{'; intervals separate' if significant else ''}")
      numbers = {"m2": _core_numbers(a), "m4": _core_numbers(b),
                 "intervals_separate": bool(significant)}
      reason = ("gap intervals separate" if significant else
                "gap intervals overlap: the difference is not significant")
      out.append(Judgment(line, "C5", ok, (a, b), numbers, reason))
  return out


def _baseline(r: Record, plain: Sequence[Record]) -> Record | None:
  """The plain fixed model at the cure's M with its needles: of the same training budget and
  seed where there is one, then the same budget, then the same seed."""
  same = [b for b in plain if b.chunk_size == r.chunk_size and _lengths(b) == _lengths(r)
          and b.setup.task == r.setup.task]
  # min keeps the first of equals, so without a match the first plain model stands, as before
  return min(same, default=None, key=lambda b: (needle_block(b) != needle_block(r),
                                                b.setup.seed != r.setup.seed))


def _cure_tests(r: Record, adjusted: Adjusted) -> tuple[bool, bool | None, str, dict[str, Any]]:
  """(periodic by the offset-level tests, periodic by the haystack-level tests or None
  without them, their text, their numbers): far depth and all depths pooled, each with no
  period by ``no_period`` (p Holm-adjusted where given), the haystack-level test beside."""
  a, every = r.analysis, r.all_depths
  p_all = None if every is None else every.p_value
  p_all_holm = adjusted.all_depths if every is not None else None
  periodic = not no_period(_p(r, adjusted), a.detected_period) or (
      every is not None and not no_period(p_all if p_all_holm is None else p_all_holm,
                                          every.detected_period))
  text = (f"{_p_text(r, adjusted)}, detected period {_period(a.detected_period)}"
          + ("" if every is None else
             f" (all depths pooled: p = {p_value(p_all)}"
             + ("" if p_all_holm is None else f", Holm {p_value(p_all_holm)}")
             + f", detected period {_period(every.detected_period)})"))
  numbers: dict[str, Any] = {"all_depths_p_value": p_all, "all_depths_detected_period":
                             None if every is None else every.detected_period}
  if p_all_holm is not None:
    numbers["all_depths_p_value_holm"] = p_all_holm
  haystack = [x for x in (adjusted.haystack_far, adjusted.haystack_all_depths) if x is not None]
  periodic_haystack = None
  if haystack:
    periodic_haystack = any(x <= NULL_ALPHA for x in haystack)
    text += (f"; haystack-level test p = {p_value(adjusted.haystack_far)}"
             + ("" if adjusted.haystack_all_depths is None else
                f" (all depths {p_value(adjusted.haystack_all_depths)})"))
    numbers.update(haystack_p_value=adjusted.haystack_far,
                   all_depths_haystack_p_value=adjusted.haystack_all_depths)
  return periodic, periodic_haystack, text, numbers


def _cure_claim(r: Record, plain: Sequence[Record],
                adjusted: Adjusted = NO_ADJUSTMENT) -> Judgment:
  m = r.chunk_size
  base = _baseline(r, plain)
  a = r.analysis
  gap, far = a.max_gap, far_accuracy(r)
  periodic, periodic_haystack, tests, test_numbers = _cure_tests(r, adjusted)
  ratio = r.compression_ratio
  text = (f"{r.name} ({r.setup.chunking}, M/target {m}, achieved ratio "
          f"{number(ratio, '.2f')}, {_needle(r)}): gap {number(gap)}, far accuracy "
          f"{number(far)}, {tests}")
  claim = ("C9" if r.setup.key_shift else "C8" if r.setup.attention == "dynamic" else None)
  numbers = dict(_core_numbers(r, adjusted), compression_ratio=ratio, **test_numbers)
  if r.chunk_phase is not None:  # the weak spot relative to the actual chunk (content position)
    numbers.update(chunk_phase_gap=r.chunk_phase.gap.value,
                   chunk_phase_p_value=r.chunk_phase.p_value,
                   chunk_phase_weakest=r.chunk_phase.weakest_phase)
  if base is None:
    return Judgment(f"CURE (no baseline): {text}; no plain fixed M={m} variant with these "
                    "needles", claim, None, (r,), numbers,
                    f"no plain fixed M={m} baseline with these needles")
  numbers["baseline"] = _core_numbers(base)
  b_gap, b_far = base.analysis.max_gap, far_accuracy(base)
  b_gate, b_gate_name = gate_accuracy(base)
  holds = None
  if None in (gap, far, b_gap, b_far, b_gate):
    verdict = "incomplete numbers"
  elif b_gate < LEARNED_ACCURACY:
    verdict = (f"inconclusive: the baseline's {b_gate_name} is below {LEARNED_ACCURACY} (the task "
               "was not learned), so its gap says nothing about a blind spot")
  else:
    smaller, better = gap < b_gap, far >= b_far
    holds = smaller and not periodic
    if periodic_haystack is not None:
      numbers["holds_haystack"] = smaller and not periodic_haystack
    if smaller and better and not periodic:
      verdict = "removes the periodic blind spot at no accuracy cost"
    elif smaller and not periodic:
      verdict = "removes the periodic blind spot but loses far accuracy"
    elif smaller:
      verdict = "reduces the gap, still periodic"
    else:
      verdict = "does not reduce the gap"
  line = (f"CURE: {text} vs {base.name} gap {number(b_gap)}, far accuracy {number(b_far)}: "
          f"{verdict}")
  reason = verdict
  if r.chunk_phase is not None:
    c = r.chunk_phase
    reason += (f" (in absolute position; by phase inside its own chunk: gap {number(c.gap.value)}, "
               f"{c.weakest_text()}, p = {p_value(c.p_value)})")
  return Judgment(line, claim, holds, (r, base), numbers, reason)


def _untested(claim: str, line: str, reason: str) -> Judgment:
  return Judgment(f"INCONCLUSIVE (no data): {line}", claim, None, (), {}, reason)


def claim_of(r: Record) -> str | None:
  """The claim a record's phase test feeds (None: a cure without a claim, e.g. stagger)."""
  if is_plain_fixed(r):
    return "C7" if is_code_model(r) else "C1"
  if r.setup.attention == "full":
    return "C2"
  if _is_ablation(r):
    return "C3" if not r.setup.rope else "C4"
  if is_cure(r):
    return "C9" if r.setup.key_shift else "C8" if r.setup.attention == "dynamic" else None
  return None


def judge(records: Sequence[Record],
          adjusted: Mapping[str, Adjusted] | None = None) -> list[Judgment]:
  """Every judgment the sweep's variants allow, in verdict-line order; a claim they cannot
  test gets one judgment without records (its line starts with "INCONCLUSIVE (no data)").
  ``adjusted``: record name -> its tests as its claim reads them (``Adjusted``)."""
  adjusted = adjusted or {}
  of = lambda r: adjusted.get(r.name, NO_ADJUSTMENT)  # noqa: E731
  seeds: dict[str, set[int]] = {}
  for r in records:
    seeds.setdefault(r.setup.variant, set()).add(r.setup.seed)
  plain = [r for r in records if is_plain_fixed(r)]
  out = [_period_claim(r, of(r)) for r in plain]
  if not plain:
    out.append(_untested("C1", "period = M (no plain fixed variant)",
                         "no plain fixed variant in the sweep"))
  full = [r for r in records if r.setup.attention == "full"]
  out += [_full_claim(r, of(r)) for r in full]
  if not full:
    out.append(_untested("C2", "full attention has no period (no full-attention variant)",
                         "no full-attention variant in the sweep"))
  ablations = [r for r in records if _is_ablation(r)]
  out += [_ablation_claim(r, of(r), one_seed=len(seeds[r.setup.variant]) == 1
                          and seed_pooling.POOLED_SUFFIX not in r.name) for r in ablations]
  if not any(not r.setup.rope for r in ablations):
    out.append(_untested("C3", "still periodic with RoPE off (no such variant)",
                         "no fixed variant with RoPE off in the sweep"))
  if not any(r.setup.pooling == "mean" for r in ablations):
    out.append(_untested("C4", "still periodic with uniform pooling (no such variant)",
                         "no fixed variant with uniform (mean) pooling in the sweep"))
  gaps = _gap_claims(plain)
  out += gaps or [_untested("C5", "gap(M=2) < gap(M=4) (needs plain fixed M=2 and M=4)",
                            "needs plain fixed M=2 and M=4 with the same needles and seed")]
  cures = [r for r in records if is_cure(r)]
  out += [_cure_claim(r, plain, of(r)) for r in cures]
  if not cures:
    out.append(_untested("C8", "cures (no dynamic, staggered, random-phase, overlap or "
                         "key-shift compressed variant)", "no dynamic-chunking variant"))
  return out


def decide(records: Sequence[Record], pooled: Mapping[str, Record] | None = None,
           adjusted: Mapping[str, Adjusted] | None = None) -> list[str]:
  """Verdict lines for the claims the sweep's variants can test (module docstring), then
  those of the seed-pooled records of variants with several seeds (``pooling``)."""
  return verdict_lines(judge(records, adjusted),
                       judge(list(pooled.values()), adjusted) if pooled else None)


def verdict_lines(judged: Sequence[Judgment],
                  pooled_judged: Sequence[Judgment] | None) -> list[str]:
  """``decide``'s lines from judgments already made (``judge`` of the records, and of their
  seed-pooled records or None): those of every trained model, then of the pooled records."""
  return [j.line for j in judged] + [
      j.line for j in pooled_judged or ()
      if j.records and seed_pooling.POOLED_SUFFIX in j.records[0].name]

