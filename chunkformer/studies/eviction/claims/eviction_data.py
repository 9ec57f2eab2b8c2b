"""What the eviction claims (E1-E3) read: each policy's correctness matrices per trained model.

The ``eviction_needles`` probe stores, per unit, one record per policy (``probes
.eviction_needles[<label>]``: the policy's config dict, its budget in tokens, per depth the
accuracies and the name of its matrix) and the matrices themselves (``DIR/correct/<unit>.npz``
as ``eviction_needles_<key>``). ``collect`` turns them into the engine's groups
(``claims.policy_groups``: one policy at one depth on one model variant, with one run per
training seed; ``Group.setting`` is the policy, ``budget`` its budget in tokens). A group's
seed-pooled matrix stacks its seeds' haystack rows (``stats.seed_rule.pool_seeds``), as the
study's seed-pooled records do (a matrix's statistics at the chunk lengths a claim reads:
``claims.grouped.analyse``). ``phase_rows`` gives the report's table (accuracy by residue mod
L, pooled over seeds, with Wilson intervals).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from chunkformer import eviction
from chunkformer.evaluation.claims import policy_groups
from chunkformer.evaluation.claims.policy_groups import Group
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.variant import VariantRecord

PROBE = "eviction_needles"
# The model must retrieve before anything is evicted: its held-out far accuracy (rows as in
# training) at least this, else its seed is undecided for every eviction claim.
MODEL_ACCURACY = 0.9
READING = policy_groups.Reading(PROBE, "policy",
                                lambda spec, where: eviction.from_dict(dict(spec), field=where),
                                eviction.short_label)


of_kind = policy_groups.of_kind  # the groups whose policy is exactly of one class


def budget(group: Group) -> tuple[int, ...]:
  """The budget in tokens for each prompt length the probe used (the first unit's record)."""
  return tuple(int(b) for b in group.entries[0]["budget_tokens"])


def same_setting(a: Group, b: Group) -> bool:
  """Two groups a comparison pairs: one model variant, one depth, one budget in tokens."""
  return a.variant == b.variant and a.depth == b.depth and budget(a) == budget(b)


def same_budget_setting(a: Group, b: Group) -> bool:
  """One model variant, one depth, one budget as the policies were given it: E2's pairing,
  since ChunkKV as published rounds its budget down to whole chunks (up to L - 1 tokens fewer
  than a policy that fills the same budget exactly)."""
  return a.variant == b.variant and a.depth == b.depth and a.setting.budget == b.setting.budget


def collect(records: Sequence[VariantRecord],
            load: correctness.Loader | None) -> list[Group]:
  """Every (variant, policy, depth) group of the records' eviction_needles results, in the
  records' order then the probe's; runs in seed order."""
  return policy_groups.collect(READING, records, load)


def short(policy: eviction.Policy) -> str:
  """A policy's name with a grid's chunk length: "chunkkv L=4" (figure legends)."""
  return policy.name + (f" L={policy.chunk}" if isinstance(policy, eviction.ChunkKV) else "")


@dataclasses.dataclass(frozen=True)
class PhaseRow(policy_groups.PhaseRow):
  """The report's row of one group (``policy_groups.PhaseRow``) with its budget."""

  budget: tuple[int, ...] = ()  # tokens kept
  given: int | float = 0  # the budget the policy was given (whole-chunk ChunkKV keeps fewer)


def phase_rows(records: Sequence[VariantRecord], load: correctness.Loader | None,
               lengths: Sequence[int] = (4, 8, 10)) -> list[PhaseRow]:
  """A row per group with stored matrices (every seed's), by the budget given, then in the
  probe's order."""
  rows = policy_groups.phase_rows(
      collect(records, load), lengths,
      lambda g, **common: PhaseRow(kind=g.setting.name, short=short(g.setting), **common,
                                   budget=budget(g), given=g.setting.budget))
  return sorted(rows, key=lambda r: (r.variant, r.depth, r.given))
