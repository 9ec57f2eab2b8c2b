"""C17-C21: does a cure remove the accuracy period in absolute position under the paper's
protocol, and what does it leave inside the chunk? (docs/claims.md, "The cures under the
paper's protocol"; written with plan version 5 before any of its units trained.)

One standard for every cure. Per unit and per seed-pooled row (the prompt as the unit), the
period decision by effect size (``effect_size.decisions``: the power gate of a periodicity
claim at the row's stride, the position term of the claim rules) in both paddings: a unit
holds when neither padding is periodic with any period (flat or no period in both), fails
when either is periodic, and is undecided otherwise (the gate failed: it barely learned). The
one seed rule over the units with the row's pooled decision; a claim over several rows (C20's
two routers) is their common verdict. A cure removes something only if its reference row is
periodic with period 8 by C10's reading under the same seed rule; otherwise the claim is
INCONCLUSIVE ("nothing to remove").

What remains inside the chunk is described beside each verdict and decides nothing: accuracy
by phase of the evaluation grid (residue mod S) for a fixed-grid cure, by the target key's
phase inside the chunk the model formed for a dynamic one, prefix padding, seeds pooled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.formatting import percent
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.stats import period_effect
from chunkformer.evaluation.stats.seed_rule import (
    INCONCLUSIVE,
    REPRODUCED,
    common_verdict,
    seed_agreement,
)
from chunkformer.studies.paper.claims import effect_size
from chunkformer.studies.paper.claims import paper_rows as pr

# claim -> (the cure, its rows, the reference row that must be periodic with period 8)
CURES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "C17": ("random chunk phase", ("cure_random_phase",), "w8s8_1kv"),
    "C18": ("per-head stagger", ("cure_stagger_8kv",), "w8s8_8kv"),
    "C19": ("a key shift", ("cure_key_shift",), "w8s8_1kv"),
    "C20": ("dynamic chunking", ("cure_dynamic_router", "cure_dynamic_router_end"),
            "cure_dynamic_fixed"),
    "C21": ("a stride of 2", ("cure_w4s2_1kv",), "w8s8_1kv"),
}
REFERENCE_STRIDE = 8
STATEMENTS = {claim_id: f"{cure} removes the lookup accuracy period in absolute position"
              for claim_id, (cure, _, _) in CURES.items()}
INSIDE_PHASES = 8  # phases 0-7 of a dynamic chunk shown one by one, longer ones as ">= 8"


def removes(by_padding: Mapping[str, period_effect.PeriodDecision | None],
            stride: int | None = None) -> bool | None:
  """A unit's or row's reading: no period in either padding holds, a period in either fails,
  anything else (a padding undecided or missing) is undecided."""
  found = [by_padding.get(p) for p in effect_size.PADDINGS]
  if any(d is not None and d.verdict == period_effect.PERIODIC for d in found):
    return False
  if all(d is not None and d.verdict in (period_effect.FLAT, period_effect.NO_PERIOD)
         for d in found):
    return True
  return None


def inside_chunk(load: correctness.Loader | None, units: Sequence[str],
                 dynamic: bool, stride: int) -> str:
  """Accuracy by phase inside the chunk (module docstring), prefix padding, seeds pooled."""
  stack = [effect_size._matrix(load, u, pr.DECIDING_PADDING) for u in units]
  if not stack or any(m is None for m in stack):
    return "inside the chunk: no stored answers"
  correct = np.concatenate([m.correct_YxJ.ravel() for m in stack])
  if dynamic:
    if any(m.phases_YxJ is None for m in stack):
      return "inside the chunk: no chunk phases stored"
    phases = np.minimum(np.concatenate([m.phases_YxJ.ravel() for m in stack]), INSIDE_PHASES)
    labels = [str(p) for p in range(INSIDE_PHASES)] + [f">={INSIDE_PHASES}"]
    where = "by phase in the chunk the model formed"
  else:
    phases = np.concatenate([np.broadcast_to(m.offsets_J % stride, m.correct_YxJ.shape).ravel()
                             for m in stack])
    labels = [str(p) for p in range(stride)]
    where = f"by phase of the evaluation grid (residue mod {stride})"
  cells = []
  for p, label in enumerate(labels):
    hit = phases == p
    if hit.any():
      cells.append(f"{label}: {percent(correct[hit].mean())} ({int(hit.sum())})")
  return f"inside the chunk, {where} (prompts): " + ", ".join(cells)


def _unit_text(by_padding) -> str:
  return ", ".join(f"{p} {effect_size._text(by_padding.get(p))}" for p in effect_size.PADDINGS)


def judge(claim_id: str, records: Sequence[VariantRecord],
          d: effect_size.Decisions | None, load: correctness.Loader | None,
          flags: Mapping[str, str] | None = None) -> Claim:
  """``claim_id`` (C17-C21) under plan version 5's rule (module docstring)."""
  cure, rows, reference = CURES[claim_id]
  statement = STATEMENTS[claim_id]
  present = [r for r in rows if d is not None and r in d.members]
  if not present:
    return pr.no_data(claim_id, statement, f"no {' or '.join(rows)} row with stored answers")
  by_name = {r.name: r for r in records}
  rules, lines, numbers, units_used = {}, [], {}, []
  for row in present:
    members = d.members[row]
    per_seed = [removes(d.units[u]) for u in members]
    pooled = removes(d.rows[row])
    rule = seed_agreement(per_seed, pooled, min_agree=pr.MIN_SEEDS)
    rules[row] = rule
    units_used += list(members)
    stride = d.strides[row] or REFERENCE_STRIDE
    dynamic = by_name[members[0]].setup.attention == "dynamic"
    inside = inside_chunk(load, members, dynamic, stride)
    lines.append(f"{rule.verdict}: {claim_id} {cure} removes the period ({row}): "
                 + "; ".join(f"{u}: {_unit_text(d.units[u])}" for u in members)
                 + f"; pooled: {_unit_text(d.rows[row])}; {inside}"
                 + pr.flag(list(members), flags or {}))
    numbers[row] = {"verdict": rule.verdict, "seeds": rule.count, "inside_chunk": inside,
                    "units": {u: {p: None if d.units[u][p] is None else d.units[u][p].record()
                                  for p in effect_size.PADDINGS} for u in members},
                    "pooled": {p: None if d.rows[row][p] is None else d.rows[row][p].record()
                               for p in effect_size.PADDINGS}}
  found, note = common_verdict({r: x.verdict for r, x in rules.items()}, "rows")
  reference_text = _reference(d, reference)
  if found != INCONCLUSIVE and reference_text:
    found, note = INCONCLUSIVE, "; ".join(x for x in (note, reference_text) if x)
  summary = "; ".join(pr.row_summary(r, x) for r, x in rules.items())
  reason = (f"{summary}" + (f"; {note}" if note else "")
            + f"; test: in both paddings no period (flat or no period) by the period decision "
              f"by effect size (power gate: a 20-point dip at one phase of S), the prompt as "
              f"the unit, {pr.MIN_SEEDS} seeds agreeing; reference {reference} periodic with "
              f"period {REFERENCE_STRIDE}" + pr.flag(units_used, flags or {}))
  numbers.update(units=units_used, lines=lines, reference=reference)
  return Claim(claim_id, statement, found, reason, numbers, pr.agreeing(rules, found))


def _reference(d: effect_size.Decisions, reference: str) -> str:
  """'' when ``reference`` is REPRODUCED as periodic with period 8 (C10's reading, the one
  seed rule), else why the cure has nothing to remove."""
  if reference not in d.members:
    return f"nothing to remove: no {reference} row with stored answers"
  rule, _ = effect_size._rule(d, reference, effect_size.periodic_with_s, padded=True)
  if rule.verdict != REPRODUCED:
    return (f"nothing to remove: its reference {reference} is not periodic with period "
            f"{REFERENCE_STRIDE} ({rule.verdict}, {rule.count})")
  return ""
