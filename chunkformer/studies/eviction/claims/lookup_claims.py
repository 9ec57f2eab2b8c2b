"""Claims E4-E6: E1-E3 restated for the position-matched lookup test (plan version 5 of the
paper's table, ``results/paper_plan5/PLAN.md`` section 4; docs/claims.md).

Read from the ``eviction_lookup`` probe (the lookup under each eviction policy, the cache
pruned at the record region's end): per unit, policy and padding a correctness matrix of
prompts x residues of the target key's position, with the target positions. A **group** is
one policy on one model variant in one padding, with one run per training seed; every seed
answered the same prompts, so the seed-pooled decision takes the prompt (its mean over
seeds) as the unit. The one seed rule (``stats.seed_rule``: two seeds agreeing and the pooled
test) per group, the common verdict over the groups that decide (as E1-E3).

- **E4** ChunkKV as published (whole chunks of L on a grid from position 0) gives a lookup
  accuracy period of L: the period decision by effect size (``stats.period_effect.decide``,
  position term as the claim rules say) detects period L, its power gate a 20-point dip at
  one phase of L above chance + 20 points. The candidate periods are the divisors of the R
  residues from 2 to R: a period of R = 8 on 8 residues is a residue effect that no shorter
  period explains.
- **E5** content-chunked ChunkKV removes it at equal budget: against the ChunkKV groups given
  the same budget (whole chunks keep up to L - 1 tokens fewer) that are periodic with their L
  in the same seed (pooled: pooled), the content policy's decision is flat or no period
  (under the same gate at each such L) AND its gap (best minus worst phase mod L, raw
  accuracy) is smaller at each such L. Undecided without a periodic baseline or when the gate
  fails (mean within 20 points of chance, or too little power).
- **E6** SnapKV answers more lookups than StreamingLLM at the same budget in tokens: per seed
  the exact two-sided McNemar test on the same prompts (p < 0.05 with SnapKV ahead holds,
  with StreamingLLM ahead fails, else undecided); seed-pooled, each prompt's outcome averaged
  over seeds and the paired sign-flip test over prompts (``E6_FLIPS`` flips), Holm over the
  groups' pooled tests. H2O at the same budget is reported beside and decides nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from chunkformer import eviction
from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.claims.grouped import Outcome, holm_of
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.stats import period_effect, residue_effect
from chunkformer.evaluation.stats.residue_accuracy import summarize
from chunkformer.studies.eviction.claims import eviction_data as data
from chunkformer.studies.eviction.claims.eviction_claims import PAIRED_ALPHA, combine, no_data
from chunkformer.studies.eviction.stats.sign_flip import sign_flip_test

PROBE = "eviction_lookup"
# The CPU-size lookup's chance: one of 32 values (results/paper_plan5/PLAN.md section 1).
CHANCE = 1 / 32
E6_FLIPS = 10_000  # the plan's sign flips for the pooled E6 test


@dataclasses.dataclass(frozen=True)
class Run:
  """One policy in one padding on one trained model (one seed)."""

  unit: str
  seed: int
  matrix: correctness.Matrix | None  # None: not stored


@dataclasses.dataclass(frozen=True)
class Group:
  """One policy (``label``) in one padding (``mode``) on one model variant, over its seeds."""

  variant: str
  label: str
  policy: eviction.Policy
  budget: int  # tokens kept at the prompt's end
  mode: str
  runs: tuple[Run, ...]

  @property
  def name(self) -> str:
    return f"{self.variant}/{eviction.short_label(self.label)}/{self.mode}"

  @property
  def seeds(self) -> tuple[int, ...]:
    return tuple(r.seed for r in self.runs)


def collect(records: Sequence[VariantRecord], load: correctness.Loader | None) -> list[Group]:
  """Every (variant, policy, padding) group of the records' eviction_lookup results, in the
  records' order then the probe's; runs in seed order. Units that recorded nothing (the probe's
  ``full_only``) are skipped, and so are a plan's size rows (``VariantSetup.is_side_row``:
  described by the size trend, not judged by E4-E6)."""
  runs: dict[tuple[str, str, str], list[Run]] = {}
  meta: dict[tuple[str, str, str], tuple[eviction.Policy, int]] = {}
  for record in records:
    found = (record.probes or {}).get(PROBE)
    if not found or record.setup.is_side_row:
      continue
    stored = (load(record.name) if load is not None else None) or {}
    for label, entry in found.items():
      policy = eviction.from_dict(dict(entry["policy"]),
                                  field=f"{record.name}: probes.{PROBE}.{label}.policy")
      for mode, key in entry["matrices"].items():
        group = (record.setup.variant, label, mode)
        runs.setdefault(group, []).append(
            Run(record.name, record.setup.seed, stored.get(f"{PROBE}_{key}")))
        meta.setdefault(group, (policy, int(entry["budget_tokens"])))
  return [Group(v, label, *meta[(v, label, mode)], mode,
                tuple(sorted(found, key=lambda r: r.seed)))
          for (v, label, mode), found in runs.items()]


def of_kind(groups: Sequence[Group], kind: type) -> list[Group]:
  """The groups whose policy is exactly of class ``kind``."""
  return [g for g in groups if type(g.policy) is kind]


def _stack(matrices: Sequence[correctness.Matrix | None]) -> list[correctness.Matrix] | None:
  """The seeds' matrices when every one is stored and they share one shape, else None."""
  if not matrices or any(m is None for m in matrices) or len(
      {m.correct_YxJ.shape for m in matrices}) != 1:
    return None
  return list(matrices)


def decide(matrices: Sequence[correctness.Matrix | None], length: int,
           rules: claim_rules.Rules = claim_rules.CURRENT_RULES
           ) -> period_effect.PeriodDecision | None:
  """The period decision on one seed's or the seeds' pooled matrix (module docstring: the
  divisors of R from 2 to R, the gate of a 20-point dip at one phase of ``length``); None
  without stored matrices."""
  stack = _stack(matrices)
  if stack is None:
    return None
  residues = stack[0].correct_YxJ.shape[1]
  if residues % length:
    return None
  positions = correctness.shared_positions(stack) if rules.position_term else None
  table = residue_effect.from_prompts(np.stack([m.correct_YxJ for m in stack]),
                                      positions_YxR=positions)
  periods = tuple(p for p in range(2, residues + 1) if residues % p == 0)
  return period_effect.decide(table, periods=periods,
                              gate=(period_effect.PERIODIC_DIP, length, CHANCE),
                              floored_gate=rules.floored_design_effect)


def gap(matrices: Sequence[correctness.Matrix | None], length: int) -> float | None:
  """Best minus worst phase of the target position mod ``length`` (raw accuracy, seeds and
  prompts pooled); None without stored matrices."""
  stack = _stack(matrices)
  if stack is None:
    return None
  by_residue = np.mean([m.correct_YxJ.mean(axis=0) for m in stack], axis=0)
  phases = np.asarray(stack[0].offsets_J) % length
  means = [by_residue[phases == p].mean() for p in range(length) if np.any(phases == p)]
  return float(max(means) - min(means))


def _text(d: period_effect.PeriodDecision | None) -> str:
  if d is None:
    return "no matrix"
  return f"periodic {d.period}" if d.verdict == period_effect.PERIODIC else d.verdict


def _numbers(matrices, d: period_effect.PeriodDecision | None, length: int) -> dict[str, Any]:
  stack = _stack(matrices)
  return {"accuracy": None if stack is None else float(np.mean([m.correct_YxJ.mean()
                                                                for m in stack])),
          "decision": _text(d), "gap": gap(matrices, length),
          "period_decision": None if d is None else d.record()}


# --- E4 ----------------------------------------------------------------------------------


def _period_outcome(matrices, length: int, rules: claim_rules.Rules) -> Outcome:
  d = decide(matrices, length, rules)
  numbers = _numbers(matrices, d, length)
  if d is None:
    return Outcome(None, "correctness matrix not stored", numbers)
  holds = period_effect.period_is(d, length)
  return Outcome(holds, d.reason if holds is None else
                 ("" if holds else f"decided {_text(d)}"), numbers)


def _periods(groups: Sequence[Group], rules: claim_rules.Rules
             ) -> dict[str, tuple[list[Outcome], Outcome]]:
  return {g.name: ([_period_outcome([r.matrix], g.policy.chunk, rules) for r in g.runs],
                   _period_outcome([r.matrix for r in g.runs], g.policy.chunk, rules))
          for g in groups}


def e4_claim(evidence) -> Claim:
  groups = of_kind(collect(evidence.records, evidence.matrices), eviction.ChunkKV)
  if not groups:
    return no_data("E4", f"no ChunkKV policy in the sweep's {PROBE} results")
  return combine("E4", _periods(groups, evidence.rules), evidence.rules)


# --- E5 ----------------------------------------------------------------------------------


def _same_budget(a: Group, b: Group) -> bool:
  """One variant, one padding, one budget as the policies were given it (E5's pairing)."""
  return a.variant == b.variant and a.mode == b.mode and a.policy.budget == b.policy.budget


def _cure_outcome(matrices, baselines: Mapping[int, float | None],
                  rules: claim_rules.Rules) -> Outcome:
  """Content chunks against the periodic grids ``baselines`` (L -> the grid's gap)."""
  if not baselines:
    return Outcome(None, "no periodic fixed-block baseline at this budget",
                   {"periodic_baselines": []})
  decided = {m: decide(matrices, m, rules) for m in baselines}
  numbers = {"periodic_baselines": sorted(baselines),
             "baseline_gap": {str(m): g for m, g in baselines.items()},
             **{str(m): _numbers(matrices, d, m) for m, d in decided.items()}}
  if any(d is None for d in decided.values()):
    return Outcome(None, "correctness matrix not stored", numbers)
  if any(d.verdict == period_effect.PERIODIC for d in decided.values()):
    return Outcome(False, "still periodic", numbers)
  undecided = [d.reason for d in decided.values() if d.verdict == period_effect.UNDECIDED]
  if undecided:
    return Outcome(None, undecided[0], numbers)
  smaller = all(gap(matrices, m) < g for m, g in baselines.items() if g is not None)
  return Outcome(smaller, "" if smaller else "gap not smaller", numbers)


def _cures(cures: Sequence[Group], grids: Sequence[Group], rules: claim_rules.Rules
           ) -> dict[str, tuple[list[Outcome], Outcome]]:
  out = {}
  for c in cures:
    bases = [g for g in grids if _same_budget(g, c)]

    def periodic(grid: Group, matrices) -> bool:
      d = decide(matrices, grid.policy.chunk, rules)
      return d is not None and period_effect.period_is(d, grid.policy.chunk) is True

    seeds = []
    for run in c.runs:
      base = {g.policy.chunk: gap([r.matrix], g.policy.chunk) for g in bases
              for r in g.runs if r.seed == run.seed and periodic(g, [r.matrix])}
      seeds.append(_cure_outcome([run.matrix], base, rules))
    base = {g.policy.chunk: gap([r.matrix for r in g.runs], g.policy.chunk) for g in bases
            if periodic(g, [r.matrix for r in g.runs])}
    out[c.name] = (seeds, _cure_outcome([r.matrix for r in c.runs], base, rules))
  return out


def e5_claim(evidence) -> Claim:
  groups = collect(evidence.records, evidence.matrices)
  cures = of_kind(groups, eviction.ContentChunkKV)
  if not cures:
    return no_data("E5", f"no content-chunked ChunkKV policy in the sweep's {PROBE} results")
  return combine("E5", _cures(cures, of_kind(groups, eviction.ChunkKV), evidence.rules),
                 evidence.rules)


# --- E6 ----------------------------------------------------------------------------------


def mcnemar(a: np.ndarray, b: np.ndarray) -> tuple[int, int, float]:
  """(A right where B wrong, B right where A wrong, the exact two-sided McNemar p): the
  binomial test of the discordant pairs against 1/2; p = 1 without discordant pairs."""
  a, b = np.asarray(a).ravel() > 0.5, np.asarray(b).ravel() > 0.5
  only_a, only_b = int(np.sum(a & ~b)), int(np.sum(b & ~a))
  if only_a + only_b == 0:
    return only_a, only_b, 1.0
  return only_a, only_b, float(scipy_stats.binomtest(only_a, only_a + only_b).pvalue)


def _seed_outcome(a: correctness.Matrix | None, b: correctness.Matrix | None) -> Outcome:
  if a is None or b is None or a.correct_YxJ.shape != b.correct_YxJ.shape:
    return Outcome(None, "correctness matrix not stored", {})
  only_a, only_b, p = mcnemar(a.correct_YxJ, b.correct_YxJ)
  numbers = {"snapkv_accuracy": float(a.correct_YxJ.mean()),
             "streaming_llm_accuracy": float(b.correct_YxJ.mean()),
             "snapkv_only": only_a, "streaming_llm_only": only_b, "p_value": p}
  if p >= PAIRED_ALPHA:
    return Outcome(None, f"no significant difference (McNemar p = {p:.3g})", numbers)
  return Outcome(only_a > only_b, "", numbers)


def _pooled_prompts(runs: Sequence[Run], seeds: Sequence[int]) -> np.ndarray | None:
  """Each prompt's outcome averaged over ``seeds`` (a flat vector), None when any is missing."""
  stack = _stack([r.matrix for r in runs if r.seed in seeds])
  return None if stack is None else np.mean([m.correct_YxJ for m in stack], axis=0).ravel()


def _beside_h2o(groups: Sequence[Group], snap: Group) -> dict[str, float]:
  """H2O's accuracy at SnapKV's budget, per seed (reported, deciding nothing)."""
  return {str(r.seed): float(r.matrix.correct_YxJ.mean())
          for g in of_kind(groups, eviction.H2O)
          if g.variant == snap.variant and g.mode == snap.mode and g.budget == snap.budget
          for r in g.runs if r.matrix is not None}


def e6_claim(evidence) -> Claim:
  groups = collect(evidence.records, evidence.matrices)
  pairs = [(a, b) for a in of_kind(groups, eviction.SnapKV)
           for b in of_kind(groups, eviction.StreamingLLM)
           if (a.variant, a.mode, a.budget) == (b.variant, b.mode, b.budget)]
  if not pairs:
    return no_data("E6", f"no SnapKV and StreamingLLM policies at the same budget in the "
                   f"sweep's {PROBE} results")
  pooled = {}
  for a, b in pairs:
    common = [s for s in a.seeds if s in b.seeds]
    va, vb = _pooled_prompts(a.runs, common), _pooled_prompts(b.runs, common)
    pooled[(a.name, b.name)] = (None if va is None or vb is None or va.shape != vb.shape else
                                sign_flip_test(va, vb, num_permutations=E6_FLIPS,
                                               seed=evidence.seed))
  adjusted = holm_of([(k, t.p_value) for k, t in pooled.items() if t is not None])
  out = {}
  for a, b in pairs:
    by_seed = {r.seed: r for r in b.runs}
    seeds = [_seed_outcome(r.matrix, by_seed[r.seed].matrix) for r in a.runs
             if r.seed in by_seed]
    test = pooled[(a.name, b.name)]
    if test is None:
      pool = Outcome(None, "correctness matrix not stored", {})
    else:
      p = adjusted[(a.name, b.name)]
      numbers = {"snapkv_accuracy": test.mean_a, "streaming_llm_accuracy": test.mean_b,
                 "difference": test.difference, "p_value": test.p_value, "p_judged": p,
                 "prompts": test.num_haystacks, "holm_family": len(adjusted),
                 "h2o_accuracy_beside": _beside_h2o(groups, a)}
      pool = (Outcome(None, f"no significant difference (p = {p:.3g})", numbers)
              if p >= PAIRED_ALPHA else Outcome(test.difference > 0, "", numbers))
    out[f"{a.name} vs {b.label}"] = (seeds, pool)
  return combine("E6", out, evidence.rules)


# --- the report's rows ---------------------------------------------------------------------


def phase_rows(records: Sequence[VariantRecord], load: correctness.Loader | None,
               lengths: Sequence[int] = (4, 8)) -> list[data.PhaseRow]:
  """The eviction report's rows (``eviction_data.PhaseRow``) of the lookup groups with every
  seed's matrix stored: accuracy by the target position's residue mod L, seeds pooled; the
  padding in the depth column ("lookup, prefix")."""
  rows = []
  for g in collect(records, load):
    stack = _stack([r.matrix for r in g.runs])
    if stack is None:
      continue
    correct = np.concatenate([m.correct_YxJ.ravel() for m in stack])
    residues = np.concatenate([np.broadcast_to(m.offsets_J, m.correct_YxJ.shape).ravel()
                               for m in stack])
    by_length = {m: summarize(correct, residues % m, m, None) for m in lengths
                 if stack[0].offsets_J.size % m == 0}
    rows.append(data.PhaseRow(g.variant, g.label, g.policy.name, data.short(g.policy),
                              f"lookup, {g.mode}", len(g.runs), float(correct.mean()),
                              by_length, budget=(g.budget,), given=g.policy.budget))
  return sorted(rows, key=lambda r: (r.variant, r.depth, r.given))
