"""C14-C16: the paper's mechanism claims (docs/claims.md, "The paper's protocol"), judged from
the ``head_knockout``, ``gate_concentration`` and ``gate_cycling`` probes' records.

C14 knockout losses of some KV heads of W = S models concentrate on few phases, not in full
attention; C15 statically concentrated gates line up with the phases their head's knockout
hurts; C16 cycling the gates moves the within-window weak phases while the boundary phase
stays weak. Numbers carry the verdict lines and the units, as in ``paper_claims``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from chunkformer.evaluation.claims import plan_check
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.formatting import p_value, percent
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.stats.seed_rule import (
  INCONCLUSIVE,
  NOT_REPRODUCED,
  REPRODUCED,
  common_verdict,
)
from chunkformer.studies.paper.claims import paper_rows as pr
from chunkformer.studies.paper.stats import cycling

STATEMENTS = {
    "C14": "phase specialisation: knockout losses of some KV heads of W = S models concentrate "
           "on few phases; not in full attention",
    "C15": "statically concentrated gates line up with the phases their KV head's knockout "
           "hurts",
    "C16": "gate cycling moves the within-window weak phases (R^2 >= 0.5 without the boundary "
           "phase) while the boundary phase stays the weakest",
}
KNOCKOUT_FLOOR = 0.02  # mean loss over residues below this: the knockout barely hurts
SPECIALISED_ALPHA = 0.05  # family-wise (Holm)
SPECIALISED_EFFECT = 0.10  # the top phase loses >= 10 points more than the median phase
ALIGNED_ALPHA = 0.05
R2_MIN = 0.5
BOUNDARY_SLACK = 0.05


def phase_loss(change_R: Sequence[float], stride: int) -> np.ndarray:
  """The knockout's accuracy loss max(0, -change) summed by residue mod ``stride``: [S]."""
  loss = np.maximum(0.0, -np.asarray(change_R, np.float64))
  return np.bincount(np.arange(loss.size) % stride, weights=loss, minlength=stride)


def concentration_test(clean_R: Sequence[float], knocked_R: Sequence[float], stride: int,
                       prompts_per_residue: int) -> tuple[float, float]:
  """(effect, p): how far the knockout's loss at its top phase exceeds its loss at the median
  phase (accuracy, by phase r mod S), and the one-sided p-value of that excess: z against the
  two phases' binomial standard errors (clean and knocked counted as independent, which
  overstates the error of paired outcomes), Bonferroni over the S phases the top is picked
  from."""
  clean = np.asarray(clean_R, np.float64)
  knocked = np.asarray(knocked_R, np.float64)
  phases = np.arange(clean.size) % stride
  n_S = np.bincount(phases, minlength=stride) * prompts_per_residue
  c_S = np.bincount(phases, weights=clean, minlength=stride) / np.bincount(phases)
  k_S = np.bincount(phases, weights=knocked, minlength=stride) / np.bincount(phases)
  loss_S, var_S = c_S - k_S, (c_S * (1 - c_S) + k_S * (1 - k_S)) / n_S
  order = np.argsort(loss_S)
  top, mid = order[-1], order[(stride - 1) // 2]
  effect = float(loss_S[top] - loss_S[mid])
  se = math.sqrt(var_S[top] + var_S[mid])
  if se == 0:
    return effect, 0.0 if effect > 0 else 1.0
  return effect, float(min(1.0, stride * scipy_stats.norm.sf(effect / se)))


def _knockout(unit: VariantRecord) -> dict[str, Any] | None:
  return (unit.probes or {}).get("head_knockout") or None


def _stride(unit: VariantRecord) -> int:
  return pr.REFERENCE_STRIDE if pr.is_full(unit.setup) else unit.chunk_size


def tested_heads(unit: VariantRecord) -> list[dict[str, Any]]:
  """The knockout heads above the floor (phases need a modulus divisible by S)."""
  found = _knockout(unit)
  if found is None or found["modulus"] % _stride(unit):
    return []
  return [h for h in found["heads"]
          if np.mean(np.maximum(0.0, -np.asarray(h["change"], np.float64))) >= KNOCKOUT_FLOOR]


def _half(rows: Mapping[str, list[VariantRecord]], compressed: bool, *,
          flags: Mapping[str, str], **_: Any):
  """One half of C14: per row its seed rule, the lines and numbers."""
  heads, effects = {}, {}  # (unit, layer, kv head) -> raw p, effect
  for unit in (u for units in rows.values() for u in units):
    found = _knockout(unit)
    for h in tested_heads(unit):
      key = (unit.name, h["layer"], h["kv_head"])
      effects[key], heads[key] = concentration_test(found["clean"], h["accuracy"],
                                                    _stride(unit), found["prompts_per_residue"])
  claim_holm = pr.holm_of(heads)

  def specialised(keys, adjusted) -> list:
    return [k for k in keys if adjusted[k] < SPECIALISED_ALPHA
            and effects[k] >= SPECIALISED_EFFECT]

  def decide(keys, adjusted) -> bool | None:
    if not keys:
      return None
    found = bool(specialised(keys, adjusted))
    return found if compressed else not found

  what = "phase specialisation" if compressed else "no phase specialisation (full attention)"
  need = (f"specialised: Holm p < {SPECIALISED_ALPHA} and the top phase losing >= "
          f"{percent(SPECIALISED_EFFECT)} points more than the median phase; need "
          + ("a specialised head" if compressed else "none"))
  rules, lines, numbers, units_used = {}, [], {}, []
  for variant, units in rows.items():
    holds = []
    for unit in units:
      units_used.append(unit.name)
      mine = {k: p for k, p in heads.items() if k[0] == unit.name}
      unit_holm = pr.holm_of(mine)
      h = decide(list(mine), unit_holm)
      holds.append(h)
      best = max(mine, key=lambda k: (effects[k], -mine[k])) if mine else None
      numbers[unit.name] = {"holds": h, "tested_heads": len(mine), "heads": {
          f"L{k[1]}H{k[2]}": {"effect": effects[k], "p_value": mine[k],
                              "p_value_holm_unit": unit_holm[k],
                              "p_value_holm_claim": claim_holm[k]} for k in mine}}
      where = ("no head above the knockout floor" if best is None else
               f"{len(mine)} tested heads, {len(specialised(mine, unit_holm))} specialised; "
               f"largest L{best[1]}H{best[2]}: top phase {percent(effects[best])} points above "
               f"the median, p = {p_value(mine[best])} (Holm over the unit's heads: "
               f"{p_value(unit_holm[best])})")
      lines.append(f"{pr.head(h)}: C14 {what} ({unit.name}, S={_stride(unit)}): {where} "
                   f"({need}){plan_check.flag([unit.name], flags)}")
    names = {u.name for u in units}
    pooled = [k for k in claim_holm if k[0] in names]
    pooled_holds = decide(pooled, claim_holm)
    numbers[f"{variant} ({pr.POOLED})"] = {"holds": pooled_holds, "heads": len(pooled),
                                           "holm_family": len(claim_holm)}
    rules[variant] = pr.seed_rule(holds, pooled_holds if len(units) > 1 else holds[0])
  return rules, lines, numbers, units_used


def c14(records: Sequence[VariantRecord], *, seed: int = 0, num_permutations: int = 2000,
        flags: Mapping[str, str] | None = None) -> Claim:
  flags = flags or {}
  kw = dict(seed=seed, num_permutations=num_permutations, flags=flags)
  compressed = pr.rows(records, lambda r: pr.is_w_equals_s(r.setup) and _knockout(r))
  full = pr.rows(records, lambda r: pr.is_full(r.setup) and _knockout(r))
  if not compressed and not full:
    return pr.no_data("C14", STATEMENTS["C14"], "no W = S geometry row or full-attention row "
                      "with a head_knockout record")
  halves, lines, numbers, units, notes = {}, [], {}, [], []
  for name, found, is_compressed in (("W = S rows", compressed, True),
                                     ("full-attention rows", full, False)):
    if not found:
      halves[name] = INCONCLUSIVE
      notes.append(f"{name}: no data")
      continue
    rules, more, nums, used = _half(found, is_compressed, **kw)
    verdict, note = common_verdict({v: r.verdict for v, r in rules.items()}, "rows")
    halves[name] = verdict
    lines += more
    numbers[name] = dict(nums, seed_rule={v: r.record() for v, r in rules.items()})
    units += used
    notes.append(f"{name}: {verdict}" + (f" ({note})" if note else "") + "; " + "; ".join(
        pr.row_summary(v, r) for v, r in rules.items()))
  verdicts = set(halves.values())
  verdict = (NOT_REPRODUCED if NOT_REPRODUCED in verdicts else
             REPRODUCED if verdicts == {REPRODUCED} else INCONCLUSIVE)
  seeds = [r for half in numbers.values() for r in half["seed_rule"].values()]
  agree = (sum(r["fails"] if verdict == NOT_REPRODUCED else r["holds"] for r in seeds
               if verdict == INCONCLUSIVE or r["verdict"] == verdict))
  counted = sum(r["seeds"] for r in seeds if verdict == INCONCLUSIVE or r["verdict"] == verdict)
  test = (f"test: a head is specialised when its top phase loses >= {percent(SPECIALISED_EFFECT)} "
          f"points more than its median phase with Holm p < {SPECIALISED_ALPHA} (Bonferroni "
          "over the S phases; Holm over the heads of each half of the claim); "
          f"{pr.MIN_SEEDS} seeds per row")
  reason = test + " | " + " | ".join(notes) + plan_check.flag(units, flags)
  return Claim("C14", STATEMENTS["C14"], verdict, reason,
               dict(numbers, units=units, lines=lines), f"{agree}/{counted}")


def predicted_phase(gate: Mapping[str, Any], stride: int, align: str) -> int:
  """The phase a gate's peak offset reads (a value gate: the key before it)."""
  o = int(np.argmax(gate["mean_alpha"]))
  phase = o % stride if align == "start" else (o - gate["window"]) % stride
  return (phase - 1) % stride if gate["stream"] == "v" else phase


def alignment(unit: VariantRecord) -> tuple[int, int, list[str]]:
  """(concentrated gates with a tested knockout head, those that line up, their notes)."""
  gates = ((unit.probes or {}).get("gate_concentration") or {}).get("gates") or []
  stride = unit.chunk_size
  knocked = {(h["layer"], h["kv_head"]): int(np.argmax(phase_loss(h["change"], stride)))
             for h in tested_heads(unit)}
  n = m = 0
  notes = []
  for g in gates:
    if g["static"] > g["window"] / 2 or (g["layer"], g["head"]) not in knocked:
      continue
    want = predicted_phase(g, stride, unit.setup.window_align)
    got = knocked[(g["layer"], g["head"])]
    n, m = n + 1, m + (want == got)
    notes.append(f"L{g['layer']}/{g['stream']}/H{g['head']} static {g['static']:.2f}: gate "
                 f"phase {want}, knockout phase {got}")
  return n, m, notes


def _can_pass(n: int, stride: int) -> bool:
  """Whether n gates could pass at all: all of them lining up gives p = (1/S)^n."""
  return n > 0 and stride ** -n < ALIGNED_ALPHA


def _binomial(n: int, m: int, stride: int) -> float:
  return float(scipy_stats.binom.sf(m - 1, n, 1.0 / stride))


def c15(records: Sequence[VariantRecord], *, flags: Mapping[str, str] | None = None,
        **_: Any) -> Claim:
  flags = flags or {}
  found = pr.rows(records, lambda r: pr.is_w_equals_s(r.setup) and _knockout(r)
                  and (r.probes or {}).get("gate_concentration"))
  if not found:
    return pr.no_data("C15", STATEMENTS["C15"], "no W = S geometry row with head_knockout and "
                      "gate_concentration records")
  counts = {v: [alignment(u) for u in units] for v, units in found.items()}
  pooled_p = {v: _binomial(sum(n for n, _, _ in c), sum(m for _, m, _ in c),
                           found[v][0].chunk_size)
              for v, c in counts.items() if sum(n for n, _, _ in c)}
  adjusted = pr.holm_of(pooled_p)
  rules, lines, numbers, units_used = {}, [], {}, []
  need = f"need binomial p < {ALIGNED_ALPHA}, chance 1/S per gate"
  for variant, units in found.items():
    holds = []
    stride = units[0].chunk_size
    for unit, (n, m, notes) in zip(units, counts[variant], strict=True):
      units_used.append(unit.name)
      p = _binomial(n, m, stride) if n else None
      h = None if p is None or not _can_pass(n, stride) else p < ALIGNED_ALPHA
      holds.append(h)
      numbers[unit.name] = {"holds": h, "concentrated": n, "aligned": m, "p_value": p}
      lines.append(f"{pr.head(h)}: C15 gates line up with knockouts ({unit.name}, S={stride}): "
                   f"{m} of {n} statically concentrated gates line up"
                   + ("" if p is None else f", binomial p = {p_value(p)}")
                   + f" ({need}){'; ' if notes else ''}{'; '.join(notes)}"
                   f"{plan_check.flag([unit.name], flags)}")
    q = adjusted.get(variant)
    gates = sum(n for n, _, _ in counts[variant])
    pooled_holds = None if q is None or not _can_pass(gates, stride) else q < ALIGNED_ALPHA
    numbers[f"{variant} ({pr.POOLED})"] = {"holds": pooled_holds, "p_value":
                                           pooled_p.get(variant), "p_value_holm": q,
                                           "holm_family": len(adjusted)}
    rules[variant] = pr.seed_rule(holds, pooled_holds if len(units) > 1 else holds[0])
  test = (f"test: one-sided binomial p < {ALIGNED_ALPHA} of the aligned gates (chance 1/S), "
          f"the seed-pooled p Holm-adjusted over the claim's {len(adjusted)} rows; "
          f"{pr.MIN_SEEDS} seeds per row")
  return pr.over_rows("C15", STATEMENTS["C15"], rules, lines=lines, numbers=numbers,
                      units=units_used, flags=flags, test=test)


def cycling_holds(accuracy: Mapping[int, Sequence[float]], stride: int
                  ) -> tuple[bool | None, dict[str, Any]]:
  """C16 of accuracy by phase per cycle (0 = as trained)."""
  r2 = cycling.cycle_r_squared({d: np.asarray(a) for d, a in accuracy.items()}, stride)
  boundary = stride - 1
  margins = {d: float(a[boundary] - min(x for r, x in enumerate(a) if r != boundary))
             for d, a in accuracy.items()}
  weak = all(x <= BOUNDARY_SLACK for x in margins.values())
  numbers = {"r_squared": r2, "boundary_margin": {str(d): x for d, x in margins.items()},
             "boundary_weakest": weak, "mean": float(np.mean(accuracy[0]))}
  if r2 is None or numbers["mean"] < pr.LOOKUP_LEARNED:
    return None, numbers
  return r2 >= R2_MIN and weak, numbers


def _cycling(unit: VariantRecord) -> dict[int, list[float]] | None:
  found = (unit.probes or {}).get("gate_cycling")
  if not found:
    return None
  return {int(d): list(a) for d, a in found["accuracy"].items()}


def c16(records: Sequence[VariantRecord], *, flags: Mapping[str, str] | None = None,
        **_: Any) -> Claim:
  flags = flags or {}
  # rows of the paper's table only: a plan's cure and size rows are judged by C17-C21 and the
  # size trend (paper_rows.is_table_row), even where they carry a gate_cycling record
  found = pr.rows(records, lambda r: pr.is_table_row(r.setup) and _cycling(r) is not None)
  if not found:
    return pr.no_data("C16", STATEMENTS["C16"], "no row with a gate_cycling record (W = S, "
                      "per-offset gates)")
  rules, lines, numbers, units_used = {}, [], {}, []
  need = (f"need R^2 >= {R2_MIN} and the boundary phase within {percent(BOUNDARY_SLACK)} points of "
          "the weakest other phase under every cycle")

  def line(h, name, stride, nums, units):
    r2 = nums["r_squared"]
    worst = max(nums["boundary_margin"].values())
    return (f"{pr.head(h)}: C16 cycling ({name}, S={stride}): R^2 "
            f"{'-' if r2 is None else f'{r2:.3f}'} without the boundary phase; the boundary "
            f"phase's accuracy minus the weakest other phase's, largest over the cycles: "
            f"{percent(worst)} points ({need}){plan_check.flag([u.name for u in units], flags)}")

  for variant, units in found.items():
    stride = units[0].chunk_size
    holds, curves = [], []
    for unit in units:
      units_used.append(unit.name)
      accuracy = _cycling(unit)
      curves.append(accuracy)
      h, nums = cycling_holds(accuracy, stride)
      holds.append(h)
      numbers[unit.name] = dict(nums, holds=h)
      lines.append(line(h, unit.name, stride, nums, [unit]))
    same = all(c.keys() == curves[0].keys() for c in curves)
    pooled_holds = None
    if same:
      mean = {d: list(np.mean([c[d] for c in curves], axis=0)) for d in curves[0]}
      pooled_holds, nums = cycling_holds(mean, stride)
      numbers[f"{variant} ({pr.POOLED})"] = dict(nums, holds=pooled_holds)
      if len(units) > 1:
        lines.append(line(pooled_holds, f"{variant}, {len(units)} {pr.POOLED}", stride, nums,
                          units))
    rules[variant] = pr.seed_rule(holds, pooled_holds if len(units) > 1 else holds[0])
  return pr.over_rows("C16", STATEMENTS["C16"], rules, lines=lines, numbers=numbers,
                      units=units_used, flags=flags,
                      test=f"test: {need} (thresholds, no p-value to correct); {pr.MIN_SEEDS} "
                           "seeds per row")
