"""The paper's protocol as its claims (C10-C16, docs/claims.md) read it: rows, the lookup period
test, the seed rule with two seeds, and one claim from per-row verdicts.

A row is a sweep variant; its seeds are its units. Everything here reads the probes' records
(``probes.lookup`` counts per residue, ``probes.head_knockout``, ``probes.gate_concentration``,
``probes.gate_cycling``), never the correctness matrices, so a rejudge needs results.json only.
The lookup period test reads the counts per residue with the prompt as the unit
(``stats.residue_period``: the phase effect and the lack of fit, likelihood-ratio tests).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from chunkformer.evaluation.claims.plan_check import flag
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.formatting import p_value
from chunkformer.evaluation.records.variant import VariantRecord, VariantSetup
from chunkformer.evaluation.stats import residue_accuracy, residue_period
from chunkformer.evaluation.stats.holm import holm
from chunkformer.evaluation.stats.residue_accuracy import ResidueAccuracy
from chunkformer.evaluation.stats.seed_rule import (
  INCONCLUSIVE,
  REPRODUCED,
  SeedAgreement,
  common_verdict,
  seed_agreement,
)

LOOKUP = "lookup"
PADDINGS = ("prefix", "in_sequence")
DECIDING_PADDING = "prefix"
# The in-sequence padding whose neighbours' phases do not follow the target's
# (lookup_task.DECORRELATED): where a unit has it instead, it plays the in-sequence role.
DECORRELATED = "in_sequence_decorrelated"
LOOKUP_LEARNED = 0.2  # mean lookup accuracy below this: the unit barely retrieves
PERIOD_ALPHA = 0.01
NULL_ALPHA = 0.05
REFERENCE_STRIDE = 8  # the phases of full attention (W8/S8's stride)
LOOKUP_PERIODS = tuple(range(2, 13))  # candidates; those dividing the modulus are scanned
FLAT_BOUND = 0.06  # the paper's "within about 6 points"
MIN_SEEDS = 2  # the seed rule of C10-C16: two seeds agreeing, never one
STRIDES = (4, 6, 8, 12)
POOLED = "seeds pooled"
NO_DATA = "no data: "


def is_table_row(setup: VariantSetup) -> bool:
  """A row of the paper's table, not a plan's cure or size row (``VariantSetup.is_side_row``)."""
  return not setup.is_side_row


def window(setup: VariantSetup) -> int:
  """W: the compressor's window (``compress_window``; 0 = S, or 2S with overlap)."""
  if setup.compress_window:
    return setup.compress_window
  return 2 * setup.chunk_size if setup.overlap else setup.chunk_size


def _compressed_default(setup: VariantSetup) -> bool:
  return (is_table_row(setup) and setup.attention == "fixed" and setup.chunk_size is not None
          and not setup.stagger and not setup.random_phase and not setup.key_shift)


def is_geometry(setup: VariantSetup) -> bool:
  """Fixed stride S, window W >= S, RoPE on, gated pooling with its bias, no cure."""
  return _compressed_default(setup) and setup.rope and setup.pooling == "gated"


def is_w_equals_s(setup: VariantSetup) -> bool:
  return is_geometry(setup) and window(setup) == setup.chunk_size


def is_full(setup: VariantSetup) -> bool:
  return is_table_row(setup) and setup.attention == "full"


def ablation_kind(setup: VariantSetup) -> str | None:
  """C12's kinds: "RoPE off" or "uniform averaging" (a fixed row without a cure)."""
  if not _compressed_default(setup):
    return None
  if not setup.rope:
    return "RoPE off"
  return "uniform averaging" if setup.pooling == "mean" else None


# The stored matrices' keys of each padding role: the decorrelated padding plays the
# in-sequence role where a unit has it instead (plan version 5).
MATRIX_KEYS = {"prefix": ("prefix",), "in_sequence": ("in_sequence", DECORRELATED)}


def lookup_matrix(stored: Mapping[str, correctness.Matrix] | None,
                  padding: str) -> correctness.Matrix | None:
  """A unit's lookup answer matrix of one padding role from its stored matrices, or None."""
  stored = stored or {}
  return next((stored[f"lookup_{k}"] for k in MATRIX_KEYS[padding] if f"lookup_{k}" in stored),
              None)


def lookup_modes(record: VariantRecord) -> dict[str, ResidueAccuracy] | None:
  """The lookup probe's accuracy per residue, per padding mode (None without the probe)."""
  found = (record.probes or {}).get(LOOKUP)
  if not found:
    return None
  modes = {mode: ResidueAccuracy.from_record(value) for mode, value in found["modes"].items()}
  if "in_sequence" not in modes and DECORRELATED in modes:
    modes["in_sequence"] = modes[DECORRELATED]  # plays the in-sequence role (plan version 5)
  return modes


def shortcut(record: VariantRecord, padding: str) -> float | None:
  """The best accuracy of a strategy that never reads the target's record on the unit's
  lookup prompts of one padding role (``data/lookup_shortcuts.py``), or None where the record
  does not store it."""
  stored = ((record.probes or {}).get(LOOKUP) or {}).get("shortcuts") or {}
  found = next((stored[k] for k in MATRIX_KEYS[padding] if k in stored), None)
  return None if found is None else float(found["mean"])


def rows(records: Sequence[VariantRecord],
         keep: Callable[[VariantRecord], bool]) -> dict[str, list[VariantRecord]]:
  """variant -> its kept units, by seed."""
  out: dict[str, list[VariantRecord]] = {}
  for r in records:
    if keep(r):
      out.setdefault(r.setup.variant, []).append(r)
  return {v: sorted(units, key=lambda r: r.setup.seed) for v, units in sorted(out.items())}


def pooled_mode(units: Sequence[VariantRecord], padding: str) -> ResidueAccuracy | None:
  """The units' counts per residue summed (one seed-pooled table), None when one lacks it."""
  found = [(lookup_modes(u) or {}).get(padding) for u in units]
  if not found or any(f is None for f in found) or len({f.modulus for f in found}) != 1:
    return None
  return residue_accuracy.from_counts(np.sum([f.correct for f in found], axis=0),
                                      np.sum([f.total for f in found], axis=0), found[0].stride)


@dataclasses.dataclass(frozen=True)
class PeriodResult:
  stride: int
  p_value: float  # the phase effect of r mod S (``residue_period.phase_p_value``)
  lack_of_fit: float  # the residue effect beyond r mod S
  detected_period: int | None  # over LOOKUP_PERIODS dividing the modulus, Bonferroni
  detection_p_value: float | None  # the detected period's adjusted p


def period_test(table: ResidueAccuracy, stride: int, **_: Any) -> PeriodResult:
  """The lookup period test (docs/claims.md) on a table's counts per residue."""
  k, n = table.correct, table.total
  periods = [q for q in LOOKUP_PERIODS if len(k) % q == 0 and q < len(k)]
  detected, p = residue_period.detect_period(k, n, periods)
  return PeriodResult(stride, residue_period.phase_p_value(k, n, stride),
                      residue_period.lack_of_fit_p_value(k, n, stride), detected, p)


def no_period(p: float, detected: int | None) -> bool:
  """C2's standard on the lookup test: p > 0.05 and no detected period."""
  return p > NULL_ALPHA and detected is None


def holm_of(tests: Mapping[Any, float]) -> dict[Any, float]:
  """Holm-adjusted p-values of a family, by key."""
  keys = list(tests)
  return dict(zip(keys, (float(q) for q in holm([tests[k] for k in keys])), strict=True))


def p_text(p: float, adjusted: float | None = None, family: int = 0) -> str:
  text = f"p = {p_value(p)}"
  if adjusted is not None:
    text += f" (Holm over {family} test{'s' if family != 1 else ''} of the claim: " \
            f"{p_value(adjusted)})"
  return text


def head(holds: bool | None) -> str:
  return "REPRODUCED" if holds else ("INCONCLUSIVE" if holds is None else "NOT REPRODUCED")


def seed_rule(holds_per_seed: Sequence[bool | None], pooled: bool | None) -> SeedAgreement:
  return seed_agreement(holds_per_seed, pooled, min_agree=MIN_SEEDS)


def agreeing(rules: Mapping[str, SeedAgreement], verdict: str) -> str:
  """seeds_agreeing as the needle study counts it (its ``combine.from_judgments``)."""
  if verdict == INCONCLUSIVE:
    return f"{sum(r.holds for r in rules.values())}/{sum(r.seeds for r in rules.values())}"
  counted = [r for r in rules.values() if r.verdict == verdict]
  return f"{sum(r.agreeing_seeds for r in counted)}/{sum(r.seeds for r in counted)}"


def row_summary(variant: str, rule: SeedAgreement) -> str:
  pooled = ("undecided" if rule.pooled_holds is None else
            "holds" if rule.pooled_holds else "fails")
  return (f"{variant}: {rule.verdict}, holds in {rule.count} seeds, seed-pooled test {pooled}"
          + (f" ({rule.reason})" if rule.reason else ""))


def over_rows(claim_id: str, statement: str, rules: Mapping[str, SeedAgreement], *,
              lines: Sequence[str], numbers: Mapping[str, Any], units: Sequence[str],
              flags: Mapping[str, str], requirement: str = "", test: str = "") -> Claim:
  """One claim from its rows' seed rules: the common verdict of the deciding rows;
  ``requirement`` (a reason) turns a REPRODUCED into INCONCLUSIVE (coverage the claim
  needs). Stores the verdict lines and the units it rests on in ``numbers``."""
  verdict, note = common_verdict({v: r.verdict for v, r in rules.items()}, "rows")
  if verdict == REPRODUCED and requirement:
    verdict, note = INCONCLUSIVE, requirement
  summary = "; ".join(row_summary(v, r) for v, r in sorted(rules.items()))
  reason = "; ".join(x for x in (note, test, summary) if x) + flag(units, flags)
  out = dict(numbers, seed_rule={v: r.record() for v, r in sorted(rules.items())},
             units=list(units), lines=list(lines))
  return Claim(claim_id, statement, verdict, reason, out, agreeing(rules, verdict))


def no_data(claim_id: str, statement: str, why: str) -> Claim:
  return Claim(claim_id, statement, INCONCLUSIVE, NO_DATA + why, {}, "0/0")
