"""C10-C13: the paper's lookup claims (docs/claims.md, "The paper's protocol"), judged from the
``lookup`` probe's records by the rules written there before any unit trained.

C10 the accuracy period equals S (S in 4, 6, 8, 12; overlapping or not); C11 full attention is
flat; C12 no RoPE and uniform averaging stay periodic; C13 mean accuracy hides the effect.
Each function takes the sweep's records and returns one ``Claim``; its numbers carry the
verdict lines (``lines``) and the units it rests on (``units``), which ``judging`` prints and
flags by the plan they trained under.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from chunkformer.evaluation.claims import plan_check
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.formatting import percent
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.stats.residue_accuracy import ResidueAccuracy
from chunkformer.evaluation.stats.seed_rule import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED
from chunkformer.studies.paper.claims import paper_rows as pr

STATEMENTS = {
    "C10": "the lookup accuracy period equals the stride S for S in {4, 6, 8, 12}, "
           "overlapping (W > S) or not",
    "C11": "full attention is flat on the lookup test (gap within 6 points beyond sampling "
           "noise, no period) in both padding modes",
    "C12": "no RoPE and uniform averaging stay periodic on the lookup test",
    "C13": "mean accuracy hides the effect: a compressed row within 5 points of full attention "
           "in mean, at least 20 points below it in worst residue",
}
MEAN_BOUND = 0.05
WORST_MARGIN = 0.20


def _table(unit: VariantRecord, padding: str) -> ResidueAccuracy | None:
  return (pr.lookup_modes(unit) or {}).get(padding)


def _shape(t: ResidueAccuracy) -> str:
  return (f"mean {percent(t.mean)}, worst {percent(t.worst)} (residue {t.worst_residue}), "
          f"gap {percent(t.gap)} points")


def _name(units: Sequence[VariantRecord], pooled: bool) -> str:
  return (f"{units[0].setup.variant}, {len(units)} {pr.POOLED}" if pooled
          else units[0].name)


class _Periodic:
  """C10 and C12: one period test per unit and per seed-pooled row, Holm over the pooled."""

  def __init__(self, found: Mapping[str, list[VariantRecord]], *, seed: int,
               num_permutations: int):
    self.kw = dict(seed=seed, num_permutations=num_permutations)
    self.found = found
    self.pooled = {v: pr.pooled_mode(units, pr.DECIDING_PADDING) for v, units in found.items()}
    tests = {v: pr.period_test(t, units[0].chunk_size, **self.kw)
             for v, units in found.items() if (t := self.pooled[v]) is not None}
    self.tests = tests
    self.adjusted = pr.holm_of({v: t.p_value for v, t in tests.items()})

  def test(self, table: ResidueAccuracy, stride: int) -> pr.PeriodResult:
    return pr.period_test(table, stride, **self.kw)

  def beside(self, units: Sequence[VariantRecord], pooled: bool) -> str:
    """The in-sequence padding's period test, reported beside."""
    table = (pr.pooled_mode(units, "in_sequence") if pooled
             else _table(units[0], "in_sequence"))
    if table is None:
      return ""
    t = self.test(table, units[0].chunk_size)
    return (f"; in-sequence padding: detected period {t.detected_period or 'none'}, "
            f"{pr.p_text(t.p_value)}, {_shape(table)}")


def _decide_periodic(claim_id: str, found: Mapping[str, list[VariantRecord]], judge, *,
                     seed: int, num_permutations: int, flags: Mapping[str, str]):
  """Per row: the per-seed and seed-pooled judgments (``judge(t, p_read, table, stride) ->
  (holds, need)``), their lines and the row's seed rule."""
  tests = _Periodic(found, seed=seed, num_permutations=num_permutations)
  rules, lines, numbers, units_used = {}, [], {}, []
  family = len(tests.tests)
  for variant, units in found.items():
    stride = units[0].chunk_size
    w = pr.window(units[0].setup)
    holds = []
    for unit in units:
      units_used.append(unit.name)
      table = _table(unit, pr.DECIDING_PADDING)
      if table is None:
        holds.append(None)
        continue
      t = tests.test(table, stride)
      h, need = judge(t, t.p_value, table, stride)
      holds.append(h)
      numbers[unit.name] = _numbers(t, table, h)
      lines.append(f"{pr.head(h)}: {claim_id} ({unit.name}, W={w}, S={stride}, prefix "
                   f"padding): detected period {t.detected_period or 'none'}, "
                   f"{pr.p_text(t.p_value)} at S ({need}); {_shape(table)}"
                   f"{tests.beside([unit], False)}{plan_check.flag([unit.name], flags)}")
    pooled_holds = None
    if variant in tests.tests:
      t, table = tests.tests[variant], tests.pooled[variant]
      q = tests.adjusted[variant]
      pooled_holds, need = judge(t, q, table, stride)
      numbers[f"{variant} ({pr.POOLED})"] = dict(_numbers(t, table, pooled_holds),
                                                 p_value_holm=q, holm_family=family)
      if len(units) > 1:
        lines.append(f"{pr.head(pooled_holds)}: {claim_id} ({_name(units, True)}, W={w}, "
                     f"S={stride}, prefix padding): detected period "
                     f"{t.detected_period or 'none'}, {pr.p_text(t.p_value, q, family)} at S "
                     f"({need}); {_shape(table)}{tests.beside(units, True)}"
                     f"{plan_check.flag([u.name for u in units], flags)}")
    rules[variant] = pr.seed_rule(holds, pooled_holds if len(units) > 1 else
                                  (holds[0] if holds else None))
  return rules, lines, numbers, units_used


def _numbers(t: pr.PeriodResult, table: ResidueAccuracy, holds: bool | None) -> dict[str, Any]:
  return {"stride": t.stride, "p_value": t.p_value, "detected_period": t.detected_period,
          "detection_p_value": t.detection_p_value, "mean": table.mean, "worst": table.worst,
          "worst_residue": table.worst_residue, "gap": table.gap, "holds": holds}


def _period_equals_s(t: pr.PeriodResult, p: float, table: ResidueAccuracy, stride: int):
  need = f"need period {stride} and p < {pr.PERIOD_ALPHA}"
  if t.detected_period == stride and p < pr.PERIOD_ALPHA:
    return True, need
  if p >= pr.PERIOD_ALPHA and table.mean < pr.LOOKUP_LEARNED:
    return None, need + f"; mean below the lookup gate {pr.LOOKUP_LEARNED}"
  return False, need


def _periodic(t: pr.PeriodResult, p: float, table: ResidueAccuracy, stride: int):
  need = f"need p < {pr.PERIOD_ALPHA}"
  if p < pr.PERIOD_ALPHA:
    return True, need
  if table.mean < pr.LOOKUP_LEARNED:
    return None, need + f"; mean below the lookup gate {pr.LOOKUP_LEARNED}"
  return False, need


def c10(records: Sequence[VariantRecord], *, seed: int = 0, num_permutations: int = 2000,
        flags: Mapping[str, str] | None = None) -> Claim:
  flags = flags or {}
  found = pr.rows(records, lambda r: pr.is_geometry(r.setup) and pr.lookup_modes(r) is not None)
  if not found:
    return pr.no_data("C10", STATEMENTS["C10"], "no geometry row (fixed, RoPE on, gated) with "
                      "a lookup record in the sweep")
  rules, lines, numbers, units = _decide_periodic("C10 period = S", found, _period_equals_s,
                                                  seed=seed, num_permutations=num_permutations,
                                                  flags=flags)
  strides = {found[v][0].chunk_size for v, r in rules.items() if r.verdict == REPRODUCED}
  overlapping = any(pr.window(found[v][0].setup) > found[v][0].chunk_size
                    for v, r in rules.items() if r.verdict == REPRODUCED)
  missing = [s for s in pr.STRIDES if s not in strides]
  requirement = "; ".join(x for x in (
      f"no REPRODUCED row at stride(s) {', '.join(map(str, missing))}" if missing else "",
      "no REPRODUCED overlapping row (W > S)" if not overlapping else "") if x)
  test = (f"test: detected period = S and phase-effect p < {pr.PERIOD_ALPHA} (prefix padding), "
          f"the seed-pooled p Holm-adjusted over the claim's {len(found)} rows; "
          f"{pr.MIN_SEEDS} seeds per row")
  return pr.over_rows("C10", STATEMENTS["C10"], rules, lines=lines, numbers=numbers,
                      units=units, flags=flags, requirement=requirement, test=test)


def c12(records: Sequence[VariantRecord], *, seed: int = 0, num_permutations: int = 2000,
        flags: Mapping[str, str] | None = None) -> Claim:
  flags = flags or {}
  found = pr.rows(records, lambda r: pr.ablation_kind(r.setup) is not None
                  and pr.lookup_modes(r) is not None)
  if not found:
    return pr.no_data("C12", STATEMENTS["C12"], "no fixed row with RoPE off or uniform "
                      "averaging with a lookup record in the sweep")
  rules, lines, numbers, units = _decide_periodic("C12 still periodic", found, _periodic,
                                                  seed=seed, num_permutations=num_permutations,
                                                  flags=flags)
  kinds = {pr.ablation_kind(found[v][0].setup) for v, r in rules.items()
           if r.verdict == REPRODUCED}
  missing = [k for k in ("RoPE off", "uniform averaging") if k not in kinds]
  requirement = f"no REPRODUCED row with {' or '.join(missing)}" if missing else ""
  test = (f"test: phase-effect p < {pr.PERIOD_ALPHA} at S (prefix padding), the seed-pooled p "
          f"Holm-adjusted over the claim's {len(found)} rows; {pr.MIN_SEEDS} seeds per row")
  return pr.over_rows("C12", STATEMENTS["C12"], rules, lines=lines, numbers=numbers,
                      units=units, flags=flags, requirement=requirement, test=test)


def _flat(table: ResidueAccuracy) -> float:
  """How far apart the best and the worst residue are beyond their Wilson intervals."""
  return table.low[table.best_residue] - table.high[table.worst_residue]


def c11(records: Sequence[VariantRecord], *, seed: int = 0, num_permutations: int = 2000,
        flags: Mapping[str, str] | None = None) -> Claim:
  flags = flags or {}
  found = pr.rows(records, lambda r: pr.is_full(r.setup) and pr.lookup_modes(r) is not None)
  if not found:
    return pr.no_data("C11", STATEMENTS["C11"], "no full-attention row with a lookup record "
                      "in the sweep")
  kw = dict(seed=seed, num_permutations=num_permutations)
  pooled = {(v, mode): pr.pooled_mode(units, mode) for v, units in found.items()
            for mode in pr.PADDINGS}
  pooled_tests = {k: pr.period_test(t, pr.REFERENCE_STRIDE, **kw)
                  for k, t in pooled.items() if t is not None}
  adjusted = pr.holm_of({k: t.p_value for k, t in pooled_tests.items()})
  family = len(pooled_tests)
  rules, lines, numbers, units_used = {}, [], {}, []

  def judge(tables, tests, ps):
    if any(t is None for t in tables):
      return None, "a padding mode is missing"
    parts, fails, low = [], False, False
    for mode, table, t, p in zip(pr.PADDINGS, tables, tests, ps, strict=True):
      beyond = _flat(table)
      flat = beyond <= pr.FLAT_BOUND
      nop = pr.no_period(p, t.detected_period)
      fails |= not (flat and nop)
      low |= table.mean < pr.LOOKUP_LEARNED
      parts.append(f"{mode}: {_shape(table)}, low(best) - high(worst) {percent(beyond)} points "
                   f"(need <= {percent(pr.FLAT_BOUND)}), {pr.p_text(p)} at S={pr.REFERENCE_STRIDE},"
                   f" detected period {t.detected_period or 'none'}")
    holds = False if fails else (None if low else True)
    return holds, "; ".join(parts)

  for variant, units in found.items():
    holds = []
    for unit in units:
      units_used.append(unit.name)
      tables = [_table(unit, m) for m in pr.PADDINGS]
      tests = [None if t is None else pr.period_test(t, pr.REFERENCE_STRIDE, **kw)
               for t in tables]
      h, text = judge(tables, tests, [None if t is None else t.p_value for t in tests])
      holds.append(h)
      numbers[unit.name] = {"holds": h, **{m: {"beyond_noise": _flat(t), "gap": t.gap,
                                                "mean": t.mean, "p_value": r.p_value,
                                                "detected_period": r.detected_period}
                                            for m, t, r in zip(pr.PADDINGS, tables, tests,
                                                               strict=True) if t is not None}}
      lines.append(f"{pr.head(h)}: C11 full attention flat ({unit.name}): {text}"
                   f"{plan_check.flag([unit.name], flags)}")
    tables = [pooled[(variant, m)] for m in pr.PADDINGS]
    tests = [pooled_tests.get((variant, m)) for m in pr.PADDINGS]
    qs = [adjusted.get((variant, m)) for m in pr.PADDINGS]
    pooled_holds = None
    if all(t is not None for t in tests):
      pooled_holds, text = judge(tables, tests, qs)
      numbers[f"{variant} ({pr.POOLED})"] = {
          "holds": pooled_holds, "holm_family": family,
          **{m: {"p_value": t.p_value, "p_value_holm": q, "beyond_noise": _flat(tab)}
             for m, t, q, tab in zip(pr.PADDINGS, tests, qs, tables, strict=True)}}
      if len(units) > 1:
        lines.append(f"{pr.head(pooled_holds)}: C11 full attention flat "
                     f"({_name(units, True)}; p Holm-adjusted over the claim's {family} "
                     f"tests): {text}{plan_check.flag([u.name for u in units], flags)}")
    rules[variant] = pr.seed_rule(holds, pooled_holds if len(units) > 1 else holds[0])
  test = (f"test: in both paddings low(best) - high(worst) <= {percent(pr.FLAT_BOUND)} points and "
          f"no period (p > {pr.NULL_ALPHA} at S={pr.REFERENCE_STRIDE}, none detected), the "
          f"seed-pooled p Holm-adjusted over the claim's {family} tests; {pr.MIN_SEEDS} seeds "
          "per row")
  return pr.over_rows("C11", STATEMENTS["C11"], rules, lines=lines, numbers=numbers,
                      units=units_used, flags=flags, test=test)


def reference_full(records: Sequence[VariantRecord],
                   kv_heads: int | None = None) -> list[VariantRecord] | None:
  """The full-attention row with the most seeds (ties: the first by name) with lookup; with
  ``kv_heads``, among the full rows of that many KV heads only (``kv_heads_of``)."""
  found = pr.rows(records, lambda r: pr.is_full(r.setup)
                  and _table(r, pr.DECIDING_PADDING) is not None
                  and (kv_heads is None or kv_heads_of(r) == kv_heads))
  if not found:
    return None
  return max(found.values(), key=lambda units: (len(units), [-ord(c) for c in
                                                             units[0].setup.variant]))


def kv_heads_of(unit: VariantRecord) -> int | None:
  """The unit's KV heads: recorded (``setup.num_kv_heads``), else read from a name holding
  ``<n>kv`` as the paper's runs do (files written before the field), else None."""
  if unit.setup.num_kv_heads:
    return unit.setup.num_kv_heads
  found = re.search(r"(?:^|_)(\d+)kv(?:_|$)", unit.setup.variant)
  return int(found.group(1)) if found else None


def _hides(table: ResidueAccuracy, ref: ResidueAccuracy) -> tuple[bool, dict[str, float]]:
  mean_diff = table.mean - ref.mean
  worst_below = ref.low[ref.worst_residue] - table.high[table.worst_residue]
  return (abs(mean_diff) <= MEAN_BOUND and worst_below >= WORST_MARGIN,
          {"mean_difference": mean_diff, "worst_below": worst_below})


def c13(records: Sequence[VariantRecord], *, flags: Mapping[str, str] | None = None,
        reference_gate: Callable[[str], str] | None = None, same_kv_heads: bool = False,
        **_: Any) -> Claim:
  """C13; ``reference_gate`` (row -> why the reference does not qualify, '' when it does)
  replaces the 20% lookup gate on the full-attention reference (the current claim rules);
  ``same_kv_heads`` pairs each row with the full row of its KV heads (claim rules 3) instead
  of one reference for all."""
  flags = flags or {}
  found = pr.rows(records, lambda r: pr.is_geometry(r.setup)
                  and _table(r, pr.DECIDING_PADDING) is not None)
  single = reference_full(records)
  if single is None or not found:
    return pr.no_data("C13", STATEMENTS["C13"], "needs a full-attention row and a geometry "
                      "row with lookup records")
  references = ({v: reference_full(records, kv_heads_of(units[0])) for v, units in found.items()}
                if same_kv_heads else {v: single for v in found})
  why_not = {}  # reference row -> why it does not qualify ('' when it does)
  for full in {id(f): f for f in references.values() if f is not None}.values():
    ref = pr.pooled_mode(full, pr.DECIDING_PADDING)
    if reference_gate is not None:
      why_not[full[0].setup.variant] = ("no lookup table" if ref is None
                                        else reference_gate(full[0].setup.variant))
    else:
      why_not[full[0].setup.variant] = ("" if ref is not None and ref.mean >= pr.LOOKUP_LEARNED
                                        else f"below the lookup gate {pr.LOOKUP_LEARNED}")
  if not same_kv_heads and why_not[single[0].setup.variant]:
    ref_name = _name(single, len(single) > 1)
    return Claim("C13", STATEMENTS["C13"], INCONCLUSIVE,
                 f"the full-attention reference ({ref_name}) does not qualify: "
                 f"{why_not[single[0].setup.variant]}", {}, "0/0")
  rules, lines, numbers, units_used = {}, [], {}, []
  need = (f"need |mean - full| <= {percent(MEAN_BOUND)} and full's worst Wilson low - this "
          f"worst's Wilson high >= {percent(WORST_MARGIN)} points")

  def line(h, name, table, found_numbers, units, other, full, ref):
    beside = "" if other is None else f"; in-sequence padding: {_shape(other)}"
    ref_name = _name(full, len(full) > 1)
    return (f"{pr.head(h)}: C13 mean hides the effect ({name}, prefix padding): "
            f"{_shape(table)} vs full ({ref_name}) {_shape(ref)}: mean difference "
            f"{percent(found_numbers['mean_difference'])}, worst below by "
            f"{percent(found_numbers['worst_below'])} points ({need}){beside}"
            f"{plan_check.flag([u.name for u in [*units, *full]], flags)}")

  def paired(full):  # each number names its reference when rows have their own
    return {"reference": full[0].setup.variant} if same_kv_heads else {}

  unpaired = []
  for variant, units in found.items():
    full = references[variant]
    if full is None:
      unpaired.append(f"{variant}: no full-attention row with {kv_heads_of(units[0])} KV heads")
      continue
    why = why_not[full[0].setup.variant]
    if why:
      unpaired.append(f"{variant}: its reference {full[0].setup.variant} does not qualify "
                      f"({why})")
      rules[variant] = pr.seed_rule([None] * len(units), None)
      continue
    ref = pr.pooled_mode(full, pr.DECIDING_PADDING)
    units_used += [u.name for u in full if u.name not in units_used]
    holds = []
    for unit in units:
      units_used.append(unit.name)
      table = _table(unit, pr.DECIDING_PADDING)
      h, nums = _hides(table, ref)
      holds.append(h)
      numbers[unit.name] = dict(nums, holds=h, **paired(full))
      lines.append(line(h, unit.name, table, nums, [unit], _table(unit, "in_sequence"), full,
                        ref))
    table = pr.pooled_mode(units, pr.DECIDING_PADDING)
    pooled_holds, nums = _hides(table, ref)
    numbers[f"{variant} ({pr.POOLED})"] = dict(nums, holds=pooled_holds, **paired(full))
    if len(units) > 1:
      lines.append(line(pooled_holds, _name(units, True), table, nums, units,
                        pr.pooled_mode(units, "in_sequence"), full, ref))
    rules[variant] = pr.seed_rule(holds, pooled_holds)
  reproduced = sorted(v for v, r in rules.items() if r.verdict == REPRODUCED)
  decided = [r for r in rules.values() if r.verdict != INCONCLUSIVE]
  if reproduced:
    verdict, note = REPRODUCED, f"reproduced by {', '.join(reproduced)} ({len(reproduced)} of " \
                                f"{len(rules)} rows)"
  elif decided and len(decided) == len(rules):
    verdict, note = NOT_REPRODUCED, "no row shows it"
  elif not rules:
    verdict, note = INCONCLUSIVE, "no row has a qualifying reference"
  else:
    verdict, note = INCONCLUSIVE, f"no row reproduces it; {len(rules) - len(decided)} of " \
                                  f"{len(rules)} rows undecided"
  summary = "; ".join(pr.row_summary(v, r) for v, r in sorted(rules.items()))
  if same_kv_heads:
    reference_text = "each row against the full-attention row of its KV heads"
  else:
    reference_text = f"reference {_name(single, len(single) > 1)}"
  reason = (f"{note}; test: {need} (prefix padding, Wilson margins, no p-value to correct); "
            f"{pr.MIN_SEEDS} seeds per row; {reference_text}; {summary}"
            + ("; not compared: " + "; ".join(unpaired) if unpaired else "")
            + plan_check.flag(units_used, flags))
  numbers.update(reference=(reference_text if same_kv_heads
                            else _name(single, len(single) > 1)),
                 units=units_used, lines=lines,
                 seed_rule={v: r.record() for v, r in sorted(rules.items())})
  return Claim("C13", STATEMENTS["C13"], verdict, reason, numbers, pr.agreeing(rules, verdict))
