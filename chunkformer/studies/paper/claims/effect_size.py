"""C10-C12 under the period decision by effect size (``stats.period_effect``): how they are
decided under the current claim rules (``claims.rules``, version 2).

These rules were written after the plan-version-4 results had been read (docs/claims.md,
"Period by effect size"); a sweep first judged under version 1 keeps its plan's verdicts and
shows these beside (``judging``). Per unit and padding: the lookup matrix (prompts x residues)
with the prompt as the unit; per row: its seeds pooled with the prompt as the unit (every seed
answered the same prompts). The one seed rule (``stats.seed_rule``, two seeds agreeing) over
the units, the row's pooled decision as its pooled test, the common verdict over rows:
- C10 (geometry rows) and C12 (RoPE off, uniform averaging): periodic with period S in the
  prefix padding (the deciding mode of the plan);
- C11 (full attention): flat in both paddings.
A unit the power gate leaves undecided counts neither way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.stats import period_effect, residue_effect, retrieval_gate
from chunkformer.evaluation.stats.seed_rule import (
    INCONCLUSIVE,
    SeedAgreement,
    common_verdict,
    seed_agreement,
)
from chunkformer.studies.paper.claims import paper_rows as pr

STUDY = "paper"
PADDINGS = ("prefix", "in_sequence")
DECIDING = "prefix"
CHANCE = 1 / 32  # the CPU-size lookup: 32 values to choose from (results/paper_protocol/PLAN.md)


@dataclasses.dataclass(frozen=True)
class Decisions:
  """Each lookup unit's and each row's decision per padding (None: its matrix is not stored)."""

  units: Mapping[str, Mapping[str, period_effect.PeriodDecision | None]]
  rows: Mapping[str, Mapping[str, period_effect.PeriodDecision | None]]
  members: Mapping[str, tuple[str, ...]]  # row -> its units, by seed
  strides: Mapping[str, int | None]  # row -> S (None: full attention)


def _gate(stride: int | None, chance: float = CHANCE) -> tuple[float, int, float]:
  """The power gate's smallest effect of interest: a 20-point dip at one phase of S for a
  periodic claim, a 6-point dip at one phase of 8 for a flat one (``chance``: the accuracy
  the dip may not fall below)."""
  if stride is None:
    return period_effect.FLAT_DIP, 8, chance
  return period_effect.PERIODIC_DIP, stride, chance


def _matrix(load: correctness.Loader | None, unit: str,
            padding: str) -> correctness.Matrix | None:
  return pr.lookup_matrix(None if load is None else load(unit), padding)


def _decide(stack: list[correctness.Matrix | None], stride: int | None,
            rules: claim_rules.Rules = claim_rules.CURRENT_RULES,
            shortcut: float | None = None):
  """The period decision of ``stack`` (seeds over the same prompts); under the retrieval gate
  (claim rules 5) ``shortcut`` is the prompts' best non-reading accuracy."""
  if not stack or any(x is None for x in stack) or len({x.correct_YxJ.shape
                                                        for x in stack}) != 1:
    return None
  positions = correctness.shared_positions(stack) if rules.position_term else None
  outcomes = np.stack([x.correct_YxJ for x in stack])
  table = residue_effect.from_prompts(outcomes, positions_YxR=positions)
  chance = CHANCE if not rules.retrieval_gate or shortcut is None else shortcut
  found = period_effect.decide(table, gate=_gate(stride, chance),
                               floored_gate=rules.floored_design_effect)
  why = _not_deciding(outcomes.mean(axis=0), stride, shortcut) if rules.retrieval_gate else ""
  if not why:
    return found
  return dataclasses.replace(found, verdict=period_effect.UNDECIDED, period=None,
                             reason="; ".join(x for x in (why, found.reason) if x))


def _not_deciding(per_prompt: np.ndarray, stride: int | None, shortcut: float | None) -> str:
  """Why a unit (seeds averaged per prompt) decides no period claim under the retrieval gate:
  no shortcut recorded, for full attention not past the gate ("did not learn"), at the
  ceiling or at the shortcut's floor ('' when it decides)."""
  if shortcut is None:
    return "no shortcut baseline recorded for these prompts (the retrieval gate needs it)"
  why = retrieval_gate.gate(per_prompt, shortcut).reason if stride is None else ""
  return why or retrieval_gate.at_floor_or_ceiling(float(per_prompt.mean()), shortcut)


def decide_units(load: correctness.Loader | None, units: Sequence[str], padding: str,
                 stride: int | None, rules: claim_rules.Rules = claim_rules.CURRENT_RULES,
                 shortcut: float | None = None) -> period_effect.PeriodDecision | None:
  """The period decision of ``units`` pooled (the prompt as the unit) in one padding role
  (``shortcut``: their prompts' best non-reading accuracy, ``pr.shortcut``); None without
  every unit's stored matrix."""
  return _decide([_matrix(load, u, padding) for u in units], stride, rules, shortcut)


def describe(d: period_effect.PeriodDecision | None) -> str:
  """A decision in words: "periodic 8", "flat", "no period", "undecided" or "no matrix"."""
  return _text(d)


def stride_of(setup) -> int | None:
  """The stride a row's period decision gates on: S, or None for full attention (a flat
  claim's gate at the reference stride 8)."""
  return None if setup.attention == "full" else setup.chunk_size


def decisions(records: Sequence[VariantRecord], load: correctness.Loader | None,
              rules: claim_rules.Rules = claim_rules.CURRENT_RULES) -> Decisions:
  found = pr.rows(records, lambda r: pr.lookup_modes(r) is not None)
  strides = {v: stride_of(units[0].setup) for v, units in found.items()}
  units, rows = {}, {}
  for v, members in found.items():
    for u in members:
      units[u.name] = {p: _decide([_matrix(load, u.name, p)], strides[v], rules,
                                  pr.shortcut(u, p))
                       for p in PADDINGS}
    rows[v] = {p: _decide([_matrix(load, u.name, p) for u in members], strides[v], rules,
                          pr.shortcut(members[0], p))
               for p in PADDINGS}
  return Decisions(units, rows, {v: tuple(u.name for u in m) for v, m in found.items()},
                   strides)


def prepare(e) -> Decisions:
  """The judging hook: every lookup unit and row decided once."""
  return decisions(e.records, e.matrices, e.rules)


# Why a unit is undecided under the retrieval gate, in the words its verdict line shows.
_GATE_WORDS = ("did not learn", "at ceiling", "at the floor")


def _text(d: period_effect.PeriodDecision | None) -> str:
  if d is None:
    return "no matrix"
  if d.verdict == period_effect.UNDECIDED:
    return next((w for w in _GATE_WORDS if d.reason.startswith(w)), d.verdict)
  return f"periodic {d.period}" if d.verdict == period_effect.PERIODIC else d.verdict


def periodic_with_s(d: period_effect.PeriodDecision | None, stride: int | None) -> bool | None:
  """C10/C12's reading: periodic with period S holds, any other decided outcome fails."""
  if d is None or d.verdict == period_effect.UNDECIDED:
    return None
  return d.verdict == period_effect.PERIODIC and d.period == stride


def flat_in_both(by_padding: Mapping[str, period_effect.PeriodDecision | None],
                 stride: int | None) -> bool | None:
  """C11's reading: flat in both paddings; periodic or no period in either fails."""
  found = [by_padding.get(p) for p in PADDINGS]
  if any(d is not None and d.verdict in (period_effect.PERIODIC, period_effect.NO_PERIOD)
         for d in found):
    return False
  if any(d is None or d.verdict == period_effect.UNDECIDED for d in found):
    return None
  return True


def _rule(d: Decisions, row: str, holds: Callable[[Any, int | None], bool | None],
          padded: bool) -> tuple[SeedAgreement, str]:
  stride = d.strides[row]
  pick = (lambda by: by.get(DECIDING)) if padded else (lambda by: by)
  per_seed = [holds(pick(d.units[u]), stride) for u in d.members[row]]
  rule = seed_agreement(per_seed, holds(pick(d.rows[row]), stride), min_agree=pr.MIN_SEEDS)
  shown = PADDINGS if not padded else (DECIDING,)
  text = "; ".join(f"{p}: " + ", ".join(_text(d.units[u][p]) for u in d.members[row])
                   + f" (pooled {_text(d.rows[row][p])})" for p in shown)
  return rule, f"{row}: {rule.verdict} ({text})"


def requirement(claim_id: str, reproduced: Sequence[VariantRecord]) -> str:
  """What the claim needs besides its rows agreeing (the plan's own requirement, one standard):
  C10 a REPRODUCED row at every stride of the paper and an overlapping one (W > S), C12 one
  with RoPE off and one with uniform averaging. Empty when met."""
  if claim_id == "C10":
    missing = [s for s in pr.STRIDES if s not in {r.chunk_size for r in reproduced}]
    overlapping = any(pr.window(r.setup) > r.chunk_size for r in reproduced)
    return "; ".join(x for x in (
        f"no REPRODUCED row at stride(s) {', '.join(map(str, missing))}" if missing else "",
        "no REPRODUCED overlapping row (W > S)" if not overlapping else "") if x)
  if claim_id == "C12":
    kinds = {pr.ablation_kind(r.setup) for r in reproduced}
    missing = [k for k in ("RoPE off", "uniform averaging") if k not in kinds]
    return f"no REPRODUCED row with {' or '.join(missing)}" if missing else ""
  return ""


def verdict(d: Decisions, rows: Mapping[str, VariantRecord],
            claim_id: str) -> tuple[str, str, dict, dict[str, SeedAgreement]]:
  """(verdict, reason, numbers, seed rule per row) of ``claim_id`` over ``rows`` (row -> its
  first unit's record) under the effect-size rules."""
  if not rows:
    return INCONCLUSIVE, "no row", {}, {}
  flat = claim_id == "C11"
  rules = {}
  parts = []
  for row in rows:
    rule, text = _rule(d, row, flat_in_both if flat else periodic_with_s, padded=not flat)
    rules[row] = rule
    parts.append(text)
  found, note = common_verdict({r: x.verdict for r, x in rules.items()}, "rows")
  needed = requirement(claim_id, [rows[r] for r, x in rules.items() if x.verdict == found])
  if found != INCONCLUSIVE and needed:
    found, note = INCONCLUSIVE, "; ".join(x for x in (note, needed) if x)
  reason = "; ".join(parts) + (f"; {note}" if note else "")
  numbers = {row: {"verdict": rule.verdict, "seeds": rule.count,
                   "units": {u: {p: None if d.units[u][p] is None else d.units[u][p].record()
                                 for p in PADDINGS} for u in d.members[row]},
                   "pooled": {p: None if d.rows[row][p] is None else d.rows[row][p].record()
                              for p in PADDINGS}}
             for row, rule in rules.items()}
  return found, reason, numbers, rules


ROWS = {
    "C10": lambda setup: pr.is_geometry(setup),
    "C11": lambda setup: pr.is_full(setup),
    "C12": lambda setup: pr.ablation_kind(setup) is not None,
}


def decided(claim_id: str, statement: str, records: Sequence[VariantRecord],
            d: Decisions | None, flags: Mapping[str, str] | None = None) -> Claim:
  """``claim_id`` (C10-C12) decided under the effect-size rules, with a verdict line per row."""
  if d is None or not d.rows:
    return pr.no_data(claim_id, statement, "no lookup row with stored answer matrices")
  by_name = {r.name: r for r in records}
  rows = {row: by_name[members[0]] for row, members in d.members.items()
          if ROWS[claim_id](by_name[members[0]].setup)}
  if not rows:
    return pr.no_data(claim_id, statement, "no row of the claim's kind with stored answer "
                      "matrices")
  found, reason, numbers, rules = verdict(d, rows, claim_id)
  units = [u for row in rows for u in d.members[row]]
  lines = [f"{rule.verdict}: {claim_id} by effect size ({row}): " + pr.row_summary(row, rule)
           for row, rule in rules.items()]
  reason = (f"{reason}; rules: period by effect size with a power gate, the prompt as the "
            f"unit, {pr.MIN_SEEDS} seeds agreeing" + pr.flag(units, flags or {}))
  return Claim(claim_id, statement, found, reason,
               dict(numbers, units=units, lines=lines), pr.agreeing(rules, found))


def flat_reference(d: Decisions | None) -> Callable[[str], str]:
  """C13's reference gate under the current rules: '' when the full-attention row is judged
  flat in the deciding padding (its test has the power the gate asks), else why not."""
  def gate(row: str) -> str:
    found = None if d is None else d.rows.get(row, {}).get(DECIDING)
    if found is None:
      return "no stored answer matrices to decide it"
    if found.reason.startswith("did not learn"):  # the retrieval gate (claim rules 5)
      return found.reason.split("; ")[0]
    if found.verdict != period_effect.FLAT:
      return f"it is not judged flat by effect size ({_text(found)})"
    return ""
  return gate
