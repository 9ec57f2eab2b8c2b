"""Which of the study's claims a sweep reproduced, decided from its variant records.

Claims (issue 5, DESIGN.md section 1), each checked only where the sweep has the variants:
1. fixed chunks of step M show accuracy period exactly M: detected period = M and p < 0.01;
2. full attention shows no period: p > 0.05 (at the reference M) and no detected period,
   with far accuracy >= 95%;
3. removing RoPE, or replacing the learned gate by a plain average, keeps the period
   (p < 0.01 at M);
4. a smaller step hurts less: gap(M = 2) < gap(M = 4);
5. cures (dynamic chunking, staggered or random phases, overlap, key shift on a compressed
   model): their gap and far accuracy against the plain fixed model at the same budget
   (M = the cure's chunk size or target) and the same needle lengths; a cure counts as still
   periodic if p < 0.01 at the far depth or with all depths pooled. Against a baseline below
   50% far accuracy (the task not learned) the comparison is reported as inconclusive.
A plain fixed model: fixed chunks, RoPE on, gated pooling, no overlap, no stagger, no random
phase, no key shift. Verdict lines start with REPRODUCED, NOT REPRODUCED, CURE or NOT TESTED.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Record = Mapping[str, Any]
PERIOD_ALPHA = 0.01
NULL_ALPHA = 0.05
FULL_ACCURACY = 0.95
LEARNED_ACCURACY = 0.5  # far accuracy below this: the model did not learn the task


def _far(r: Record) -> float | None:
  """The far-needle accuracy of a record ("mean_accuracy" in records that lack the field)."""
  return r.get("far_accuracy", r.get("mean_accuracy"))


def _lengths(r: Record) -> tuple[int, int]:
  return r.get("key_len", 1), r.get("value_len", 1)


def _needle(r: Record) -> str:
  if r.get("task") == "code":
    return "code needles, prefix probe"
  key, value = _lengths(r)
  return f"key {key}/value {value} token{'s' if max(key, value) > 1 else ''}"


def is_plain_fixed(r: Record) -> bool:
  return (r.get("attention") == "fixed" and r.get("rope", True) and r.get("pooling") == "gated"
          and not r.get("overlap") and not r.get("stagger") and not r.get("random_phase")
          and not r.get("key_shift"))


def _is_ablation(r: Record) -> bool:
  """Fixed, no cure switched on, but RoPE off or a different pooling."""
  return (r.get("attention") == "fixed" and not r.get("overlap") and not r.get("stagger")
          and not r.get("random_phase") and not r.get("key_shift") and not is_plain_fixed(r))


def is_cure(r: Record) -> bool:
  return r.get("attention") == "dynamic" or (r.get("attention") == "fixed" and (
      r.get("overlap") or r.get("stagger") or r.get("random_phase") or r.get("key_shift")))


def _p(value: Any) -> str:
  if value is None:
    return "-"
  return f"{value:.1e}" if value < 1e-3 else f"{value:.3f}"


def _f(value: Any, spec: str = ".3f") -> str:
  return "-" if value is None else format(value, spec)


def _period_claim(r: Record) -> str:
  m, period, p = r.get("chunk_size"), r.get("detected_period"), r.get("p_value")
  ok = period == m and p is not None and p < PERIOD_ALPHA
  head = "REPRODUCED" if ok else "NOT REPRODUCED"
  far = _far(r)
  caution = ("" if far is None or far >= LEARNED_ACCURACY else
             f"; caution: far accuracy {_f(far)} < {LEARNED_ACCURACY}, the task is barely learned")
  return (f"{head}: period = M for fixed M={m} ({r['name']}, {_needle(r)}): detected period "
          f"{period if period is not None else 'none'}, p = {_p(p)} at M (need period {m} and "
          f"p < {PERIOD_ALPHA}); max gap {_f(r.get('max_gap'))}, weakest phase "
          f"{r.get('weakest_phase')}{caution}")


def _full_claim(r: Record) -> str:
  p, period, far = r.get("p_value"), r.get("detected_period"), _far(r)
  ok = (p is not None and p > NULL_ALPHA and period is None and far is not None
        and far >= FULL_ACCURACY)
  head = "REPRODUCED" if ok else "NOT REPRODUCED"
  m = (r.get("by_chunk_size") or [{}])[0].get("chunk_size")
  return (f"{head}: full attention has no period ({r['name']}, {_needle(r)}): p = {_p(p)} at "
          f"M={m}, "
          f"detected period {period if period is not None else 'none'}, far accuracy "
          f"{_f(far)} (need p > {NULL_ALPHA}, no period, far accuracy >= {FULL_ACCURACY})")


def _ablation_claim(r: Record) -> str:
  what = []
  if not r.get("rope", True):
    what.append("RoPE off")
  if r.get("pooling") != "gated":
    what.append(f"pooling {r.get('pooling')}")
  p, period, m = r.get("p_value"), r.get("detected_period"), r.get("chunk_size")
  ok = p is not None and p < PERIOD_ALPHA
  head = "REPRODUCED" if ok else "NOT REPRODUCED"
  return (f"{head}: still periodic with {', '.join(what)} ({r['name']}, M={m}, {_needle(r)}): "
          f"p = {_p(p)} at M, detected period {period if period is not None else 'none'}, "
          f"max gap {_f(r.get('max_gap'))} (need p < {PERIOD_ALPHA})")


def _gap_claims(plain: Sequence[Record]) -> list[str]:
  lines = []
  by_lengths: dict[tuple[int, int], dict[int, Record]] = {}
  for r in plain:
    by_lengths.setdefault(_lengths(r), {}).setdefault(r.get("chunk_size"), r)
  for _, by_m in sorted(by_lengths.items()):
    if 2 in by_m and 4 in by_m:
      a, b = by_m[2], by_m[4]
      ok = a.get("max_gap") is not None and b.get("max_gap") is not None and (
          a["max_gap"] < b["max_gap"])
      separated = ok and a.get("max_gap_high") is not None and b.get("max_gap_low") is not None \
          and a["max_gap_high"] < b["max_gap_low"]
      lines.append(
          f"{'REPRODUCED' if ok else 'NOT REPRODUCED'}: gap(M=2) < gap(M=4) ({_needle(a)}): "
          f"{_f(a.get('max_gap'))} [{_f(a.get('max_gap_low'))}, {_f(a.get('max_gap_high'))}] "
          f"({a['name']}) vs {_f(b.get('max_gap'))} [{_f(b.get('max_gap_low'))}, "
          f"{_f(b.get('max_gap_high'))}] ({b['name']})"
          f"{'; intervals separate' if separated else '; intervals overlap' if ok else ''}")
  return lines


def _cure_claim(r: Record, plain: Sequence[Record]) -> str:
  m = r.get("chunk_size")
  base = next((b for b in plain if b.get("chunk_size") == m and _lengths(b) == _lengths(r)), None)
  gap, far, p = r.get("max_gap"), _far(r), r.get("p_value")
  pooled = (r.get("all_depths") or {}).get("p_value")
  ratio = r.get("compression_ratio")
  text = (f"{r['name']} ({r.get('chunking')}, M/target {m}, achieved ratio "
          f"{_f(ratio, '.2f')}, {_needle(r)}): gap {_f(gap)}, far accuracy {_f(far)}, "
          f"p = {_p(p)}" + ("" if pooled is None else f" (all depths pooled: p = {_p(pooled)})"))
  if base is None:
    return f"CURE (no baseline): {text}; no plain fixed M={m} variant with these needles"
  b_gap, b_far = base.get("max_gap"), _far(base)
  if None in (gap, far, b_gap, b_far):
    verdict = "incomplete numbers"
  elif b_far < LEARNED_ACCURACY:
    verdict = (f"inconclusive: the baseline's far accuracy is below {LEARNED_ACCURACY} (the task "
               "was not learned), so its gap says nothing about a blind spot")
  else:
    smaller, better = gap < b_gap, far >= b_far
    periodic = any(x is not None and x < PERIOD_ALPHA for x in (p, pooled))
    if smaller and better and not periodic:
      verdict = "removes the periodic blind spot at no accuracy cost"
    elif smaller and not periodic:
      verdict = "removes the periodic blind spot but loses far accuracy"
    elif smaller:
      verdict = "reduces the gap, still periodic"
    else:
      verdict = "does not reduce the gap"
  return (f"CURE: {text} vs {base['name']} gap {_f(b_gap)}, far accuracy {_f(b_far)}: "
          f"{verdict}")


def decide(records: Sequence[Record]) -> list[str]:
  """Verdict lines for the claims the sweep's variants can test (module docstring)."""
  plain = [r for r in records if is_plain_fixed(r)]
  lines = [_period_claim(r) for r in plain]
  if not plain:
    lines.append("NOT TESTED: period = M (no plain fixed variant)")
  full = [r for r in records if r.get("attention") == "full"]
  lines += [_full_claim(r) for r in full]
  if not full:
    lines.append("NOT TESTED: full attention has no period (no full-attention variant)")
  ablations = [r for r in records if _is_ablation(r)]
  lines += [_ablation_claim(r) for r in ablations]
  if not any(not r.get("rope", True) for r in ablations):
    lines.append("NOT TESTED: still periodic with RoPE off (no such variant)")
  if not any(r.get("pooling") == "mean" for r in ablations):
    lines.append("NOT TESTED: still periodic with uniform pooling (no such variant)")
  gaps = _gap_claims(plain)
  lines += gaps or ["NOT TESTED: gap(M=2) < gap(M=4) (needs plain fixed M=2 and M=4)"]
  cures = [r for r in records if is_cure(r)]
  lines += [_cure_claim(r, plain) for r in cures]
  if not cures:
    lines.append("NOT TESTED: cures (no dynamic, staggered, random-phase, overlap or key-shift "
                 "compressed variant)")
  return lines
