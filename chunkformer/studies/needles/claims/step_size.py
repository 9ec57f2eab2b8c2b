"""C5 (a smaller step hurts less) judged by the paired gap difference of the stored matrices.

For plain fixed M = 2 and M = 4 models with the same needle lengths, the far-depth matrices of
the seeds both have, stacked [N, Y, J] (seed n of M = 2 paired with seed n of M = 4; the sweep
asks every unit the same haystacks), give ``paired_gap.gap_difference`` of gap(M=2) -
gap(M=4), phases ``offset mod M``. REPRODUCED if the interval lies below 0, NOT REPRODUCED if
above, else INCONCLUSIVE with the interval; also INCONCLUSIVE when a model is below the
learned gate (``judgments.gate_accuracy`` < 0.5). Multi-token needles decide the claim when
the sweep has them (only there a split can be partial); with 1-token keys and values every
split is total at every M, so the gap cannot shrink with M. Models pair within one needle
block (``judgments.needle_block``: needle lengths and training steps); where one needle length
was trained at several budgets, the longest decides (the question is whether the blind phase
outlasts training) and the others are reported. Several needle lengths: their common verdict
where the decided ones agree, else INCONCLUSIVE. Without paired matrices ``c5_claim`` gives
None and the judgment-based claim stands (``registry``).

Under the current claim rules (``claims.rules``, version 2) a block also follows the one seed
rule: each seed's own paired difference interval is its outcome (below 0 holds, above 0 fails,
else undecided), and the block is REPRODUCED only when two seeds hold and the seeds' interval
does (``stats.seed_rule``); the seeds agreeing are counted over the blocks that decide only.
Under version 1 the seeds' interval alone decided a block and every deciding block's seeds
were counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.stats.seed_rule import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    seed_agreement,
)
from chunkformer.studies.needles.claims import combine, judgments
from chunkformer.studies.needles.stats import paired_gap

Loader = correctness.Loader
ONE_TOKEN_REASON = ("with 1-token keys and values a split is total at every M (key and value "
                    "in different chunks), so the gap cannot shrink with M; only the share of "
                    "split phases (1/M) does")


def _interval_verdict(d) -> str:
  return REPRODUCED if d.high < 0 else NOT_REPRODUCED if d.low > 0 else INCONCLUSIVE


def _c5_group(pairs: Sequence[tuple[VariantRecord, VariantRecord]], load: Loader, *,
              seed: int, num_resamples: int, confidence: float = 0.95,
              rules: claim_rules.Rules = claim_rules.CURRENT_RULES) -> dict[str, Any] | None:
  """The paired gap difference of one needle length over the seeds with both matrices."""
  a_rows, b_rows, seeds, offsets, unlearned = [], [], [], None, []
  for a, b in pairs:
    ma, mb = correctness.far_matrix(a, load), correctness.far_matrix(b, load)
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
      gate, gate_name = judgments.gate_accuracy(r)
      if gate is not None and gate < judgments.LEARNED_ACCURACY:
        unlearned.append(f"{r.name} {gate_name} {gate:.3f}")
  if not seeds:
    return None
  m_a, m_b = pairs[0][0].chunk_size, pairs[0][1].chunk_size
  phases_a, phases_b = np.mod(offsets, m_a), np.mod(offsets, m_b)
  result = paired_gap.gap_difference(np.stack(a_rows), phases_a, np.stack(b_rows), phases_b,
                                     num_resamples=num_resamples, confidence=confidence,
                                     seed=seed)
  per_seed = [paired_gap.gap_difference(x, phases_a, y, phases_b, num_resamples=1,
                                        seed=seed).difference.mean
              for x, y in zip(a_rows, b_rows, strict=True)]
  verdict = _interval_verdict(result.difference)
  extra: dict[str, Any] = {}
  if not rules.one_seed_decides:  # the one seed rule: each seed's own interval is its outcome
    own = [_interval_verdict(paired_gap.gap_difference(
        x[None], phases_a, y[None], phases_b, num_resamples=num_resamples,
        confidence=confidence, seed=seed).difference)
           for x, y in zip(a_rows, b_rows, strict=True)]
    holds = {REPRODUCED: True, NOT_REPRODUCED: False}
    agreement = seed_agreement([holds.get(v) for v in own], holds.get(verdict),
                               min_agree=rules.min_agree(len(own)))
    verdict = agreement.verdict
    extra = {"per_seed_verdict": own, "seed_rule": agreement.record()}
  if unlearned:  # a model that barely answers has a small gap whatever its chunking
    verdict = INCONCLUSIVE
  return {**paired_gap.gap_difference_record(result), **extra, "verdict": verdict,
          "not_learned": unlearned,
          "seeds": [s for s, _, _ in seeds], "units_m2": [u for _, u, _ in seeds],
          "units_m4": [u for _, _, u in seeds], "per_seed_difference": per_seed}


def _how_decided(numbers: dict[str, dict[str, Any]], deciding: dict[str, dict[str, Any]]) -> str:
  """One sentence: which needle lengths and budgets decide, and what the others say."""
  by_length: dict[tuple[int, int], list[str]] = {}
  for name, g in numbers.items():
    by_length.setdefault((g["key_len"], g["value_len"]), []).append(name)
  said = []
  for (k, v), names in sorted(by_length.items()):
    decided = [n for n in names if n in deciding]
    others = [numbers[n] for n in names if n not in deciding]
    g = numbers[decided[0]] if decided else numbers[names[-1]]
    word = {REPRODUCED: "holds", NOT_REPRODUCED: "reversed"}.get(g["verdict"], "undecided")
    text = (f"{k}/{v}-token needles: {word} at {g['steps']} steps"
            + ("" if decided else " (not deciding)"))
    if decided and others:
      text += (" (the longest budget decides; at " + ", ".join(
          f"{o['steps']} steps {o['verdict']}" for o in others) + ")")
    said.append(text)
  return "decided by: " + "; ".join(said)


def c5_group_name(key_len: int, value_len: int, steps: int) -> str:
  """The key of one needle block's paired gap difference in C5's numbers."""
  return f"key{key_len}_value{value_len}_steps{steps}"


def c5_claim(records: Sequence[VariantRecord], load: Loader | None, *, seed: int = 0,
             num_resamples: int = 2000, rules: claim_rules.Rules = claim_rules.CURRENT_RULES
             ) -> Claim | None:
  """C5 from the paired gap difference (module docstring); None without paired matrices."""
  if load is None:
    return None
  plain = [r for r in records if judgments.is_plain_fixed(r) and r.setup.task == "kv"]
  groups: dict[tuple[int, int, int], dict[int, dict[int, VariantRecord]]] = {}
  for r in plain:
    groups.setdefault(judgments.needle_block(r), {}).setdefault(
        r.chunk_size, {}).setdefault(r.setup.seed, r)
  numbers, paired = {}, {}
  for (key_len, value_len, steps), by_m in sorted(groups.items()):
    if 2 not in by_m or 4 not in by_m:
      continue
    pairs = [(by_m[2][s], by_m[4][s]) for s in sorted(set(by_m[2]) & set(by_m[4]))]
    group = (_c5_group(pairs, load, seed=seed, num_resamples=num_resamples, rules=rules)
             if pairs else None)
    if group is not None:
      name = c5_group_name(key_len, value_len, steps)
      numbers[name] = dict(group, key_len=key_len, value_len=value_len, steps=steps)
      paired[name] = pairs
  if not numbers:
    return None
  multi = {k: g for k, g in numbers.items() if g["key_len"] + g["value_len"] > 2}
  longest = {}  # needle lengths -> the group of the longest budget, which decides
  for name, g in (multi or numbers).items():
    lengths = (g["key_len"], g["value_len"])
    if lengths not in longest or g["steps"] > numbers[longest[lengths]]["steps"]:
      longest[lengths] = name
  deciding = {name: numbers[name] for name in longest.values()}
  for name, g in deciding.items():  # looked at several budgets: Bonferroni over the looks
    looks = sum((h["key_len"], h["value_len"]) == (g["key_len"], g["value_len"])
                for h in numbers.values())
    if looks > 1:
      again = _c5_group(paired[name], load, seed=seed, num_resamples=num_resamples,
                        confidence=1 - 0.05 / looks, rules=rules)
      g.update(looks=looks, bonferroni_low=again["difference_low"],
               bonferroni_high=again["difference_high"],
               same_sign_at_every_look=len({np.sign(h["difference"]) for h in numbers.values()
                                            if (h["key_len"], h["value_len"])
                                            == (g["key_len"], g["value_len"])}) == 1)
  verdict, note = combine.common_verdict({k: g["verdict"] for k, g in deciding.items()},
                                            "needle lengths")
  counted = {k: g for k, g in deciding.items()
             if not rules.decided_blocks_only or g["verdict"] != INCONCLUSIVE}
  differences = [d for g in counted.values() for d in g["per_seed_difference"]]
  agree = (sum(d > 0 for d in differences) if verdict == NOT_REPRODUCED
           else sum(d < 0 for d in differences))
  parts = [_how_decided(numbers, deciding)]
  parts += [note] if note else []
  for name, g in numbers.items():
    text = (f"key {g['key_len']}/value {g['value_len']} tokens, {g['steps']} steps: "
            f"gap(M=2) - gap(M=4) = "
            f"{g['difference']:.3f} [{g['difference_low']:.3f}, {g['difference_high']:.3f}] "
            f"(paired bootstrap over {g['num_haystacks']} haystacks x {g['num_seeds']} "
            f"seed(s); gaps {g['gap_a']:.3f} vs {g['gap_b']:.3f}): {g['verdict']}")
    if "seed_rule" in g:
      r = g["seed_rule"]
      text += (f" (seed rule: each seed's own interval below 0 in {r['holds']}/{r['seeds']}, "
               f"above in {r['fails']}/{r['seeds']}; need {r['min_agree']}"
               + (f"; {r['reason']}" if r["reason"] else "") + ")")
    if g["not_learned"]:
      text += (f" (below the {judgments.LEARNED_ACCURACY} learned gate: "
               f"{', '.join(g['not_learned'])}; a model that barely answers has a small gap "
               "whatever its chunking)")
    elif g["verdict"] == INCONCLUSIVE:
      text += " (the interval contains 0)"
    if g["key_len"] + g["value_len"] <= 2:
      text += f"; {ONE_TOKEN_REASON}" + ("; not deciding: multi-token needles do" if multi
                                         else "")
    elif name not in deciding:
      text += "; not deciding: the longer budget of these needles does"
    if "looks" in g:
      text += (f"; {g['looks']} budgets of these needles looked at: Bonferroni-adjusted "
               f"interval ({1 - 0.05 / g['looks']:.4g}) [{g['bonferroni_low']:.3f}, "
               f"{g['bonferroni_high']:.3f}], the difference "
               + ("of the same sign at every budget" if g["same_sign_at_every_look"]
                  else "changing sign between budgets"))
    parts.append(text)
  return Claim("C5", combine.STATEMENTS["C5"], verdict, "; ".join(parts), numbers,
               f"{agree}/{len(differences)}")
