"""What a lookup curve's shape says beyond noise, per unit and per row, per padding
(``stats.residue_shape``): the stride repeat beside what exact periodicity plus noise gives,
the repeat at lag S over the other lags, the weakest phase only when it is separated from the
next, and the phases that work.

A mean |A(r) - A(r + S)| of 1-2 points says nothing alone: exact periodicity plus binomial noise
at 576 prompts per residue gives about that much, and so do flat curves (every lag alike).
What says "periodic with S" is lag S against the other lags; what says "this phase is the
weak one" is a margin over the next phase beyond their interval.

The table is the prompt as the unit: a row's seeds answered the same prompts, so each prompt's
mean over its seeds is one observation (``residue_effect.from_prompts``, as the effect-size
rules read it); without stored matrices, the records' counts summed (one seed: the same table).
Full attention has no stride; its phases are those of the reference stride 8.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.stats import residue_effect, residue_shape
from chunkformer.studies.paper.claims import paper_rows as pr

WORKS_MIN = residue_shape.WORKS_MIN


@dataclasses.dataclass(frozen=True)
class Shape:
  """One curve (a unit's or a row's, one padding) described against its noise."""

  stride: int  # S, or the reference stride 8 for full attention
  repeat: float  # mean |A(r) - A(r + S)| (accuracy)
  noise: float  # its expectation under exact periodicity plus the curve's noise
  noise_upper: float  # the 95% quantile of that
  within_noise: bool  # repeat <= noise_upper: exact periodicity not rejected
  relative: float  # repeat over the mean at the lags that are not multiples of S
  weakest: int | None  # the weakest phase of S, None when not separated from the next
  lowest: int  # the lowest phase, separated or not
  margin: float  # next lowest phase minus the lowest (accuracy)
  margin_half_width: float  # the 95% interval of that margin
  working: tuple[int, ...]  # phases whose one-sided 95% lower bound is >= WORKS_MIN
  source: str  # "prompts" (the matrices) or "counts" (the records)


@dataclasses.dataclass(frozen=True)
class PublishedShape:
  """The paper's curve: no prompt counts are published, so no noise and no intervals."""

  repeat: float  # mean |A(r) - A(r + S)| (points)
  relative: float  # repeat over the other lags
  lowest: int  # the lowest phase mean of S
  margin: float  # the next lowest phase mean minus it (points)


def describe(table: residue_effect.ResidueMeans, stride: int) -> Shape:
  repeat = residue_shape.stride_repeat(table, stride)
  weakest = residue_shape.weakest_phase(table, stride)
  upper = residue_shape.noise_upper(table, stride)
  return Shape(stride, repeat.repeat, repeat.noise, upper, repeat.repeat <= upper,
               repeat.relative, weakest.phase, weakest.lowest, weakest.margin,
               weakest.half_width, residue_shape.working_phases(table, stride),
               "prompts" if table.source.startswith("prompts") else "counts")


def published(accuracy_points: Sequence[float], stride: int) -> PublishedShape:
  repeat, relative = residue_shape.lag_ratio(accuracy_points, stride)
  phases = np.asarray(accuracy_points, np.float64).reshape(-1, stride).mean(axis=0)
  low, nxt = np.argsort(phases, kind="stable")[:2]
  return PublishedShape(repeat, relative, int(low), float(phases[nxt] - phases[low]))


def _table(units: Sequence[VariantRecord], padding: str,
           load: correctness.Loader | None) -> residue_effect.ResidueMeans | None:
  stack = [pr.lookup_matrix(load(u.name) if load else None, padding) for u in units]
  if stack and all(m is not None for m in stack) and len({m.correct_YxJ.shape
                                                           for m in stack}) == 1:
    return residue_effect.from_prompts(np.stack([m.correct_YxJ for m in stack]))
  pooled = pr.pooled_mode(units, padding)
  return None if pooled is None else residue_effect.from_counts(pooled.correct, pooled.total)


def stride_of(units: Sequence[VariantRecord]) -> int:
  return units[0].chunk_size or pr.REFERENCE_STRIDE


def shapes(units: Sequence[VariantRecord], load: correctness.Loader | None,
           modulus: int | None) -> dict[str, Shape | None]:
  """padding -> the shape of ``units`` pooled (None where it has no table, or S does not
  divide the residues)."""
  s = stride_of(units)
  out = {}
  for padding in pr.PADDINGS:
    fits = modulus is not None and modulus % s == 0 and s < modulus
    table = _table(units, padding, load) if fits else None
    out[padding] = None if table is None else describe(table, s)
  return out


def by_unit(rows: Mapping[str, Sequence[VariantRecord]], load: correctness.Loader | None
            ) -> dict[str, dict[str, Shape | None]]:
  """unit -> padding -> its shape, in the rows' order."""
  out = {}
  for units in rows.values():
    for u in units:
      modulus = next(iter(pr.lookup_modes(u).values())).modulus
      out[u.name] = shapes([u], load, modulus)
  return out
