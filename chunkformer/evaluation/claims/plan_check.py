"""Pre-registration in the verdicts: which units trained under the sweep's current plan.

A sweep with ``sweep.plan`` records, before a unit trains, the plan file's state
(``provenance.file_state``: sha256, the commit that last touched it, committed or not) in the
unit's ``plan`` list. ``flags`` compares every unit's list with the plan file as it is now;
``flag_lines`` and ``flag_claims`` add the flags to the verdict lines and claim reasons of
judgments (the needle study's); ``flag`` gives the note of any list of units (the paper study's
lines). Without a current plan nothing is flagged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from chunkformer.evaluation.claims import seed_pooling
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.variant import VariantRecord

NO_PLAN = "trained with no plan"


def flags(records: Sequence[VariantRecord],
          current: Mapping[str, Any] | None) -> dict[str, str]:
  """unit -> why its verdicts are flagged (units trained under the current, committed plan are
  not in it); {} without a current plan."""
  if current is None:
    return {}
  out = {}
  for r in records:
    trained = list(r.plan or ())
    other = [s for s in trained if s.get("sha256") != current["sha256"]]
    if not trained:
      out[r.name] = NO_PLAN
    elif other:
      out[r.name] = (f"trained under another plan (sha256 {other[0]['sha256'][:12]}, commit "
                     f"{other[0].get('commit', '')[:10] or 'none'}; the current plan is "
                     f"{current['sha256'][:12]})")
    elif not all(s.get("committed") for s in trained):
      out[r.name] = "trained under this plan before it was committed"
  return out


def _units(judgment, records: Sequence[VariantRecord]) -> list[str]:
  """The units a judgment rests on (a seed-pooled record: every seed of its variant)."""
  names = []
  for r in judgment.records:
    if seed_pooling.POOLED_SUFFIX in r.name:
      names += [x.name for x in records if x.setup.variant == r.setup.variant]
    else:
      names.append(r.name)
  return names


def flag_lines(judged: Sequence[Any], pooled_judged: Sequence[Any] | None,
               records: Sequence[VariantRecord], found: Mapping[str, str]) -> list[str]:
  """``judgments.verdict_lines`` with each line's plan flags added."""
  pooled = [j for j in pooled_judged or ()
            if j.records and seed_pooling.POOLED_SUFFIX in j.records[0].name]
  return [j.line + flag(_units(j, records), found) for j in [*judged, *pooled]]


def flag_claims(claims: Sequence[Claim], judged: Sequence[Any],
                records: Sequence[VariantRecord], found: Mapping[str, str]) -> list[Claim]:
  """The claims with the plan flags of the units their judgments rest on."""
  if not found:
    return list(claims)
  out = []
  for claim in claims:
    units = list(dict.fromkeys(u for j in judged if j.claim == claim.id
                               for u in _units(j, records)))
    note = flag(units, found)
    out.append(dataclasses.replace(claim, reason=claim.reason + note) if note else claim)
  return out


def flag(units: Sequence[str], flags: Mapping[str, str]) -> str:
  """The plan flags of the units a line rests on ("" when none is flagged)."""
  found = [f"{u}: {flags[u]}" for u in units if u in flags]
  return "" if not found else "; PLAN: " + "; ".join(found)
