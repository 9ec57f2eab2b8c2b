"""C5 and C6 judged by the study's tests: the paired gap difference and the slot-gain null.

``claims(records, load)`` is ``verdicts.claims`` with these two claims replaced where the data
allow; it reads only the records (results.json) and the correctness matrices
(``DIR/correct/<unit>.npz`` through ``load``), so ``--merge`` and a recomputation give the
same claims. Where the data are missing (no matrices; records from before the slot gains at
initialisation were stored) the judgment-based claims of ``verdicts`` stand.

C5 (a smaller step hurts less): for plain fixed M = 2 and M = 4 models with the same needle
lengths, the far-depth matrices of the seeds both have, stacked [N, Y, J] (seed n of M = 2
paired with seed n of M = 4; the sweep asks every unit the same haystacks), give
``paired_gap.gap_difference`` of gap(M=2) - gap(M=4), phases ``offset mod M``. REPRODUCED if
the interval lies below 0, NOT REPRODUCED if above, else INCONCLUSIVE with the interval; also
INCONCLUSIVE when a model is below the learned gate (``verdicts.gate_accuracy`` < 0.5).
Multi-token needles decide the claim when the sweep has them (only there a split can be
partial); with 1-token keys and values every split is total at every M, so the gap cannot
shrink with M. Models pair within one needle block (``verdicts.needle_block``: needle lengths
and training steps); where one needle length was trained at several budgets, the longest
decides (the question is whether the blind phase outlasts training) and the others are
reported. Several needle lengths: their common verdict where the decided ones agree, else
INCONCLUSIVE.

C6 (heads prefer early or late phases): per plain fixed variant, each compressor site's
realised pooling weights over its seeds against the same statistic at initialisation and
under permutation of slots (``slot_null.slot_gain_null``), shift and spread judged by
``seed_agreement`` (min(2, n) of n seeds and the pooled test) at alpha / (2 x sites)
(Bonferroni over the variant's tests). A variant holds when one of its sites does, fails when
every site fails both; over the variants, the common verdict of the decided ones (undecided
ones named), INCONCLUSIVE when they disagree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chunkformer.evaluation import claims as claims_lib
from chunkformer.evaluation import correctness, paired_gap, seed_pooling, slot_null, verdicts
from chunkformer.evaluation.claims import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Claim
from chunkformer.evaluation.variant_record import VariantRecord

Loader = correctness.Loader
ALPHA = 0.05
ONE_TOKEN_REASON = ("with 1-token keys and values a split is total at every M (key and value "
                    "in different chunks), so the gap cannot shrink with M; only the share of "
                    "split phases (1/M) does")


def loader(workdir: str) -> Loader:
  """Reads ``DIR/correct/<unit>.npz`` (None where a unit has none)."""
  def load(name: str):
    path = correctness.path_for(workdir, name)
    return correctness.load(path) if os.path.exists(path) else None
  return load


def far_matrix(record: VariantRecord, load: Loader) -> correctness.Matrix | None:
  matrices = load(record.name)
  name = record.needle_matrix_name
  return None if not matrices or name is None else matrices.get(name)


def _c5_group(pairs: Sequence[tuple[VariantRecord, VariantRecord]], load: Loader, *,
              seed: int, num_resamples: int) -> dict[str, Any] | None:
  """The paired gap difference of one needle length over the seeds with both matrices."""
  a_rows, b_rows, seeds, offsets, unlearned = [], [], [], None, []
  for a, b in pairs:
    ma, mb = far_matrix(a, load), far_matrix(b, load)
    if ma is None or mb is None or ma.correct_YxJ.shape != mb.correct_YxJ.shape:
      continue
    if not np.array_equal(ma.offsets_J, mb.offsets_J) or (
        offsets is not None and not np.array_equal(offsets, ma.offsets_J)):
      continue  # not the same haystack rows: no pairing
    offsets = ma.offsets_J
    a_rows.append(ma.correct_YxJ)
    b_rows.append(mb.correct_YxJ)
    seeds.append((a.setup.seed, a.name, b.name))
    for r in (a, b):
      gate, gate_name = verdicts.gate_accuracy(r)
      if gate is not None and gate < verdicts.LEARNED_ACCURACY:
        unlearned.append(f"{r.name} {gate_name} {gate:.3f}")
  if not seeds:
    return None
  m_a, m_b = pairs[0][0].chunk_size, pairs[0][1].chunk_size
  phases_a, phases_b = np.mod(offsets, m_a), np.mod(offsets, m_b)
  result = paired_gap.gap_difference(np.stack(a_rows), phases_a, np.stack(b_rows), phases_b,
                                     num_resamples=num_resamples, seed=seed)
  per_seed = [paired_gap.gap_difference(x, phases_a, y, phases_b, num_resamples=1,
                                        seed=seed).difference.mean
              for x, y in zip(a_rows, b_rows, strict=True)]
  d = result.difference
  verdict = REPRODUCED if d.high < 0 else NOT_REPRODUCED if d.low > 0 else INCONCLUSIVE
  if unlearned:  # a model that barely answers has a small gap whatever its chunking
    verdict = INCONCLUSIVE
  return {**paired_gap.gap_difference_record(result), "verdict": verdict,
          "not_learned": unlearned,
          "seeds": [s for s, _, _ in seeds], "units_m2": [u for _, u, _ in seeds],
          "units_m4": [u for _, _, u in seeds], "per_seed_difference": per_seed}


def c5_group_name(key_len: int, value_len: int, steps: int) -> str:
  """The key of one needle block's paired gap difference in C5's numbers."""
  return f"key{key_len}_value{value_len}_steps{steps}"


def c5_claim(records: Sequence[VariantRecord], load: Loader | None, *, seed: int = 0,
             num_resamples: int = 2000) -> Claim | None:
  """C5 from the paired gap difference (module docstring); None without paired matrices."""
  if load is None:
    return None
  plain = [r for r in records if verdicts.is_plain_fixed(r) and r.setup.task == "kv"]
  groups: dict[tuple[int, int, int], dict[int, dict[int, VariantRecord]]] = {}
  for r in plain:
    groups.setdefault(verdicts.needle_block(r), {}).setdefault(
        r.chunk_size, {}).setdefault(r.setup.seed, r)
  numbers = {}
  for (key_len, value_len, steps), by_m in sorted(groups.items()):
    if 2 not in by_m or 4 not in by_m:
      continue
    pairs = [(by_m[2][s], by_m[4][s]) for s in sorted(set(by_m[2]) & set(by_m[4]))]
    group = _c5_group(pairs, load, seed=seed, num_resamples=num_resamples) if pairs else None
    if group is not None:
      numbers[c5_group_name(key_len, value_len, steps)] = dict(
          group, key_len=key_len, value_len=value_len, steps=steps)
  if not numbers:
    return None
  multi = {k: g for k, g in numbers.items() if g["key_len"] + g["value_len"] > 2}
  longest = {}  # needle lengths -> the group of the longest budget, which decides
  for name, g in (multi or numbers).items():
    lengths = (g["key_len"], g["value_len"])
    if lengths not in longest or g["steps"] > numbers[longest[lengths]]["steps"]:
      longest[lengths] = name
  deciding = {name: numbers[name] for name in longest.values()}
  verdict, note = claims_lib.common_verdict({k: g["verdict"] for k, g in deciding.items()},
                                            "needle lengths")
  differences = [d for g in deciding.values() for d in g["per_seed_difference"]]
  agree = (sum(d > 0 for d in differences) if verdict == NOT_REPRODUCED
           else sum(d < 0 for d in differences))
  parts = [note] if note else []
  for name, g in numbers.items():
    text = (f"key {g['key_len']}/value {g['value_len']} tokens, {g['steps']} steps: "
            f"gap(M=2) - gap(M=4) = "
            f"{g['difference']:.3f} [{g['difference_low']:.3f}, {g['difference_high']:.3f}] "
            f"(paired bootstrap over {g['num_haystacks']} haystacks x {g['num_seeds']} "
            f"seed(s); gaps {g['gap_a']:.3f} vs {g['gap_b']:.3f}): {g['verdict']}")
    if g["not_learned"]:
      text += (f" (below the {verdicts.LEARNED_ACCURACY} learned gate: "
               f"{', '.join(g['not_learned'])}; a model that barely answers has a small gap "
               "whatever its chunking)")
    elif g["verdict"] == INCONCLUSIVE:
      text += " (the interval contains 0)"
    if g["key_len"] + g["value_len"] <= 2:
      text += f"; {ONE_TOKEN_REASON}" + ("; not deciding: multi-token needles do" if multi
                                         else "")
    elif name not in deciding:
      text += "; not deciding: the longer budget of these needles does"
    parts.append(text)
  return Claim("C5", claims_lib.STATEMENTS["C5"], verdict, "; ".join(parts), numbers,
               f"{agree}/{len(differences)}")


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
             num_permutations: int = 2000) -> Claim | None:
  """C6 from the slot-gain null per site (module docstring); None without realised gains."""
  by_variant: dict[str, list[VariantRecord]] = {}
  for r in records:
    if verdicts.is_plain_fixed(r) and r.slot_gain:
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
                                      seed=seed, min_agree=min(2, len(runs)))
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
  verdict, note = claims_lib.common_verdict(variant_verdicts, "variants")
  reason = "; ".join(x for x in [note, *reasons] if x)
  return Claim("C6", claims_lib.STATEMENTS["C6"], verdict, reason, numbers,
               f"{agreeing[0]}/{agreeing[1]}")


def claims(records: Sequence[VariantRecord], load: Loader | None = None, *, seed: int = 0,
           num_resamples: int = 2000, num_permutations: int = 2000,
           pooled: Mapping[str, VariantRecord] | None = None) -> list[Claim]:
  """``verdicts.claims`` with C5 and C6 decided by their tests where the data allow.

  ``pooled``: the seed-pooled records (``seed_pooling.pooled_records``), computed from the
  matrices ``load`` reads when not given.
  """
  if pooled is None:
    pooled = seed_pooling.pooled_records(records, load, seed=seed, num_resamples=num_resamples,
                                         num_permutations=num_permutations)
  extra = {}
  c5 = c5_claim(records, load, seed=seed, num_resamples=num_resamples)
  if c5 is not None:
    extra["C5"] = c5
  c6 = c6_claim(records, seed=seed, num_permutations=num_permutations)
  if c6 is not None:
    extra["C6"] = c6
  return verdicts.claims(records, pooled=pooled, extra=extra)
