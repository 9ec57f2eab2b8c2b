"""C6 (heads prefer early or late phases) judged by the slot-gain null.

Per plain fixed variant, each compressor site's realised pooling weights over its seeds
against the same statistic at initialisation and under permutation of slots
(``slot_null.slot_gain_null``), shift and spread judged by the seed rule (min(2, n) of n seeds
and the pooled test) at alpha / (2 x sites) (Bonferroni over the variant's tests). A variant
holds when one of its sites does, fails when every site fails both; over the variants, the
common verdict of the decided ones (undecided ones named), INCONCLUSIVE when they disagree.
Records from before the slot gains at initialisation were stored judge only the permutation
half (INCONCLUSIVE); without realised gains ``c6_claim`` gives None (``registry``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.stats import slot_null
from chunkformer.evaluation.stats.seed_rule import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED
from chunkformer.studies.needles.claims import combine, judgments

ALPHA = 0.05


def _site_weights(records: Sequence[VariantRecord], field: str) -> dict[str, np.ndarray] | None:
  analyses = []
  for r in records:
    sites = getattr(r, field)
    if not sites:
      return None
    analyses.append({"sites": [s.to_json() for s in sites]})
  return slot_null.site_weights(analyses)


def _site_verdict(null: Mapping[str, Any]) -> str:
  found = [null[name]["agreement"]["verdict"] for name in slot_null.PERMUTED]
  if REPRODUCED in found:
    return REPRODUCED
  return NOT_REPRODUCED if set(found) == {NOT_REPRODUCED} else INCONCLUSIVE


def _site_numbers(null: Mapping[str, Any], has_init: bool) -> dict[str, Any]:
  out: dict[str, Any] = {"slots": null["slots"], "num_seeds": null["num_seeds"],
                         "alpha": null["alpha"]}
  for name in slot_null.STATISTICS:
    entry = null[name]
    out[name] = {k: entry[k] for k in ("mean", "low", "high")}
    if has_init:
      out[name]["init"] = entry["init"]["mean"]
    if name in slot_null.PERMUTED:
      out[name].update(pooled_p_value=entry["pooled_p_value"],
                       seeds_agreeing=entry["agreement"]["seeds_agreeing"],
                       verdict=entry["agreement"]["verdict"],
                       reason=entry["agreement"]["reason"])
  out["verdict"] = _site_verdict(null) if has_init else INCONCLUSIVE
  return out


def c6_claim(records: Sequence[VariantRecord], *, seed: int = 0,
             num_permutations: int = 2000, rules: claim_rules.Rules = claim_rules.CURRENT_RULES
             ) -> Claim | None:
  """C6 from the slot-gain null per site (module docstring); None without realised gains."""
  by_variant: dict[str, list[VariantRecord]] = {}
  for r in records:
    if judgments.is_plain_fixed(r) and r.slot_gain:
      by_variant.setdefault(r.setup.variant, []).append(r)
  numbers, variant_verdicts, agreeing, reasons = {}, {}, (0, 0), []
  for variant, runs in sorted(by_variant.items()):
    runs = sorted(runs, key=lambda r: r.setup.seed)
    trained = _site_weights(runs, "slot_gain")
    init = _site_weights(runs, "slot_gain_init")
    if not trained:
      continue
    alpha = ALPHA / (2 * len(trained))
    sites = {}
    for site, weights in sorted(trained.items()):
      has_init = init is not None and site in init and init[site].shape == weights.shape
      null = slot_null.slot_gain_null(weights, init[site] if has_init else None,
                                      num_permutations=num_permutations, alpha=alpha,
                                      seed=seed, min_agree=rules.min_agree(len(runs)))
      sites[site] = _site_numbers(null, has_init)
    found = [s["verdict"] for s in sites.values()]
    if init is None:
      verdict = INCONCLUSIVE
      reasons.append(f"{variant}: no slot gains of the initialised model stored (sweep from "
                     "before they were), so only the permutation half of the null exists")
    elif REPRODUCED in found:
      verdict = REPRODUCED
    elif set(found) == {NOT_REPRODUCED}:
      verdict = NOT_REPRODUCED
    else:
      verdict = INCONCLUSIVE
      why = sorted({s[k]["reason"] for s in sites.values() for k in slot_null.PERMUTED
                    if s[k]["reason"]})
      reasons.append(f"{variant}: {'; '.join(why) or 'sites undecided'}")
    held = [s for s in sites.values() if s["verdict"] == verdict] or list(sites.values())
    best = max(held, key=lambda s: max(int(s[k]["seeds_agreeing"].split("/")[0])
                                       for k in slot_null.PERMUTED))
    count = max(int(best[k]["seeds_agreeing"].split("/")[0]) for k in slot_null.PERMUTED)
    seeds = len(runs)
    count = seeds - count if verdict == NOT_REPRODUCED else count
    if seeds > agreeing[1]:
      agreeing = (count, seeds)
    numbers[variant] = {"verdict": verdict, "seeds": [r.setup.seed for r in runs],
                        "units": [r.name for r in runs], "alpha_per_test": alpha,
                        "sites_holding": sum(v == REPRODUCED for v in found), "sites": sites}
    variant_verdicts[variant] = verdict
    reasons.append(f"{variant}: {verdict} ({sum(v == REPRODUCED for v in found)}/{len(found)} "
                   f"sites show a learned slot preference at alpha {alpha:.3g}, {seeds} "
                   "seed(s))")
  if not numbers:
    return None
  verdict, note = combine.common_verdict(variant_verdicts, "variants")
  reason = "; ".join(x for x in [note, *reasons] if x)
  return Claim("C6", combine.STATEMENTS["C6"], verdict, reason, numbers,
               f"{agreeing[0]}/{agreeing[1]}")


def slot_gain_claim(records: Sequence[VariantRecord]) -> Claim:
  """C6 is measured but has no test yet: INCONCLUSIVE, with the numbers a null would judge."""
  numbers = {}
  for r in records:
    spreads = [s.preferred_phase_spread for s in r.slot_gain or ()
               if s.preferred_phase_spread is not None]
    if spreads:
      numbers[r.name] = {"seed": r.setup.seed, "max_preferred_phase_spread": max(spreads),
                         "sites": len(r.slot_gain)}
  if numbers:
    largest = max(n["max_preferred_phase_spread"] for n in numbers.values())
    reason = (f"slot gains measured for {len(numbers)} variants (largest spread of the heads' "
              f"preferred phase {largest:.2f} slots) but not judged against a null (the same "
              "statistic at initialisation and under permutation of slots)")
  else:
    reason = "no realised slot gains in the sweep (sweep.probes.slot_gain off or no fixed layer)"
  seeds = {n["seed"] for n in numbers.values()}
  return Claim("C6", combine.STATEMENTS["C6"], INCONCLUSIVE, reason, numbers,
               f"0/{len(seeds)}")

