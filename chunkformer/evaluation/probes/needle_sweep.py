"""The needle shift sweep (docs/design.md section 8) on a trained key-value retrieval model.

For each depth (far = 0, middle = 0.5, near = 1: where the window sits in the haystack) and
each of Y haystacks, one layout is sampled with a reserved window free of needles; the queried
needle is then moved through J consecutive offsets inside that window while every other token
(the other needles, the filler, the query blocks and the total length) stays identical. The
J*Y rows go through the model in jitted batches; a needle is retrieved when every answer token
is predicted exactly (greedy), and the fraction of answer tokens right is kept too.

In-distribution rows: a row asks ``data.num_queries`` queries, as training rows do. The moved
needle is asked by the FIRST query block (so the answer position is the same in every row of a
depth); the other blocks ask other needles of the haystack, a uniformly random ordered subset
drawn with the haystack (every sweep row is thus a possible training row). Only the moved
needle's answer is scored (``answer_start_N``/``answer_stop_N``, ``distance_N``): it is the
one whose phase the sweep varies; the other answers stay in the rows' ``loss_mask``. With
``data.num_queries = 1`` the rows are exactly those of the earlier one-query sweep.

Row order: row ``y * J + j`` is haystack y with the needle at ``offsets_J[j]``. Window starts
are multiples of ``spec.align`` (the sweep passes the least common multiple of its chunk
sizes), so offset index j has phase ``j mod M`` at every depth and every M.

Phases: for fixed chunks the phase is ``offset mod M``, computed by ``stats.analyze``. For
dynamic chunking the phase is the needle's offset inside the chunk it actually landed in,
``offset - (1 + last end flag before offset)``, from the end flags the model actually used
(``end_flags``, returned by the predictor as ``ends``); these differ per row, hence an
[Y, J] phase matrix.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from chunkformer.config import ConfigError, DataConfig
from chunkformer.data import kv
from chunkformer.evaluation.probes import trained as trained_lib

FIELD = "sweep.probes.needle_sweep"  # the sweep config's entry, named by errors
DEPTH_NAMES = {0.0: "far", 0.5: "middle", 1.0: "near"}


@dataclasses.dataclass(frozen=True)
class NeedleSweepSpec:
  """How a sweep samples its rows. Offsets and lengths in tokens."""

  num_offsets: int  # K consecutive needle offsets per window
  num_haystacks: int  # Y sampled haystacks per depth
  depths: tuple[float, ...] = (0.0, 0.5, 1.0)  # window placement, 0 = far ... 1 = near
  align: int = 1  # window starts are multiples of this (lcm of the chunk sizes in play)
  seed: int = 0  # haystack sampling


def depth_name(depth: float) -> str:
  return DEPTH_NAMES.get(float(depth), f"depth{depth:g}")


@dataclasses.dataclass(frozen=True)
class SweepRows:
  """The rows of one depth: S*K rendered rows and where each answer is scored."""

  depth: float
  offsets_J: np.ndarray  # absolute needle offsets (index of the first key token)
  rows: dict[str, np.ndarray]  # the batch contract's arrays, [S*K, T]
  answer_start_N: np.ndarray  # first target index of the answer, per row
  answer_stop_N: np.ndarray  # one past the last
  distance_N: np.ndarray  # QUERY index minus needle offset, per row
  layouts: tuple[kv.Layout, ...]  # per row, for inspection and tests

  @property
  def name(self) -> str:
    return depth_name(self.depth)

  @property
  def shape(self) -> tuple[int, int]:
    return len(self.layouts) // self.offsets_J.size, self.offsets_J.size


class WindowAlignmentError(ConfigError):
  """The needle window fits the haystack, but no start at a multiple of ``spec.align`` does."""


def window(config: DataConfig, spec: NeedleSweepSpec, depth: float) -> tuple[int, int]:
  """Reserved interval [start, stop) of one depth; the needle takes offsets start..start+K-1.

  Raises ConfigError naming ``sweep.probes.needle_sweep.num_offsets`` if the window does not
  fit the haystack of ``data.seq_len`` tokens, and ``WindowAlignmentError`` if it fits only at
  a start that is not a multiple of ``spec.align``.
  """
  if spec.num_offsets < 2:
    raise ConfigError(f"config field '{FIELD}.num_offsets': need >= 2 offsets, got "
                      f"{spec.num_offsets}")
  hay_stop = kv.query_start(config)
  width = spec.num_offsets - 1 + kv.needle_len(config)
  try:
    start, _ = kv.sweep_window(config, num_offsets=spec.num_offsets, depth=depth,
                               num_queries=config.num_queries)
  except ValueError as e:
    raise ConfigError(
        f"config field '{FIELD}.num_offsets': {spec.num_offsets} offsets of a "
        f"{kv.needle_len(config)}-token needle need {width} tokens, but the haystack of "
        f"data.seq_len = {config.seq_len} holds [1, {hay_stop}) ({e})") from None
  start -= start % spec.align
  if start < 1:
    start += spec.align
  if start + width > hay_stop:
    raise WindowAlignmentError(
        f"the needle window of {width} tokens must start at a multiple of {spec.align} and no "
        f"such start fits the haystack [1, {hay_stop}) of data.seq_len = {config.seq_len}")
  return start, start + width


def _haystack_rng(spec: NeedleSweepSpec, depth_index: int, haystack: int) -> np.random.Generator:
  return np.random.default_rng(np.random.SeedSequence([spec.seed, depth_index, haystack]))


def _base_layout(config: DataConfig, spec: NeedleSweepSpec, depth_index: int, haystack: int,
                 reserved: tuple[int, int]) -> kv.Layout:
  rng = _haystack_rng(spec, depth_index, haystack)
  try:
    layout = kv.sample_layout(rng, config, reserved=reserved)
  except ValueError as e:
    raise ConfigError(
        f"config field 'data.num_pairs': {config.num_pairs} needles do not fit outside the "
        f"sweep window {reserved} of data.seq_len = {config.seq_len} ({e}); use fewer "
        f"{FIELD}.num_offsets or a longer sequence") from None
  return kv.with_first_query(layout, 0)


def check_fits(config: DataConfig, spec: NeedleSweepSpec) -> None:
  """Every depth's window and haystack fit (ConfigError naming the field otherwise)."""
  if config.task != "kv":
    raise ConfigError(f"config field 'data.task': the needle shift sweep needs task 'kv', got "
                      f"{config.task!r} (use the prefix probe for code models)")
  if spec.num_haystacks < 1:
    raise ConfigError(f"config field '{FIELD}.num_haystacks': need >= 1, got "
                      f"{spec.num_haystacks}")
  for index, depth in enumerate(spec.depths):
    if not 0.0 <= depth <= 1.0:
      raise ConfigError(f"config field '{FIELD}.depths': each depth must lie in [0, 1], got "
                        f"{depth}")
    _base_layout(config, spec, index, 0, window(config, spec, depth))


def build(config: DataConfig, spec: NeedleSweepSpec) -> list[SweepRows]:
  """The rows of every depth (see module docstring); deterministic in ``spec.seed``."""
  check_fits(config, spec)
  out = []
  for index, depth in enumerate(spec.depths):
    start, stop = window(config, spec, depth)
    offsets_J = np.arange(start, start + spec.num_offsets)
    layouts = []
    for haystack in range(spec.num_haystacks):
      base = _base_layout(config, spec, index, haystack, (start, stop))
      layouts += [kv.with_pair_at(base, 0, int(o)) for o in offsets_J]
    spans = [kv.query_spans(layout)[0] for layout in layouts]  # the moved needle's query
    out.append(SweepRows(
        depth=float(depth), offsets_J=offsets_J, rows=kv.render_many(layouts, config),
        answer_start_N=np.array([s.answer_start for s in spans]),
        answer_stop_N=np.array([s.answer_stop for s in spans]),
        distance_N=np.array([s.distance for s in spans]), layouts=tuple(layouts)))
  return out


def score_answers(predictions_NxT: np.ndarray, targets_NxT: np.ndarray, rows_A: np.ndarray,
                  starts_A: np.ndarray, stops_A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(exact_A, token_accuracy_A) of A answers, answer a = targets[rows[a], starts[a]:stops[a]].

  exact is 1.0 iff every answer token is predicted; token accuracy is the fraction that is.
  """
  right_NxT = predictions_NxT == targets_NxT
  exact, tokens = np.zeros(len(rows_A)), np.zeros(len(rows_A))
  for a, (row, start, stop) in enumerate(zip(rows_A, starts_A, stops_A, strict=True)):
    hits = right_NxT[row, start:stop]
    exact[a], tokens[a] = float(hits.all()), float(hits.mean())
  return exact, tokens


def chunk_phases(ends_NxT: np.ndarray, offsets_N: np.ndarray) -> np.ndarray:
  """Offset of each needle inside the chunk it landed in: ``offset - chunk start``.

  The chunk holding token t starts right after the last end flag before t (or at 0).
  """
  phases = np.zeros(len(offsets_N), np.int64)
  for n, offset in enumerate(offsets_N):
    closed = np.flatnonzero(ends_NxT[n, :offset])
    phases[n] = offset - (closed[-1] + 1 if closed.size else 0)
  return phases


@dataclasses.dataclass(frozen=True)
class DepthResult:
  """Outcomes of one depth, [Y, J] each."""

  depth: float
  offsets_J: np.ndarray
  correct_YxJ: np.ndarray  # 1.0 iff the whole answer was predicted
  token_accuracy_YxJ: np.ndarray  # fraction of answer tokens predicted
  mean_distance: float  # tokens from the needle to its query, averaged over rows
  phases_YxJ: np.ndarray | None  # dynamic chunking: phase inside the actual chunk
  compression_ratio: float | None  # dynamic chunking: tokens per closed chunk on these rows

  @property
  def name(self) -> str:
    return depth_name(self.depth)


def run(predictor: trained_lib.Predictor, sweeps: Sequence[SweepRows]) -> list[DepthResult]:
  """Scores every depth's rows; a predictor that returns ``ends`` gives dynamic phases."""
  results = []
  for sweep in sweeps:
    out = predictor(sweep.rows)
    num_rows = len(sweep.layouts)
    exact, tokens = score_answers(out["predictions"], sweep.rows["targets"],
                                  np.arange(num_rows), sweep.answer_start_N, sweep.answer_stop_N)
    phases, ratio = None, None
    if "ends" in out:
      offsets_N = np.tile(sweep.offsets_J, sweep.shape[0])
      phases = chunk_phases(out["ends"], offsets_N).reshape(sweep.shape)
      ratio = compression_ratio(out["ends"])
    results.append(DepthResult(
        depth=sweep.depth, offsets_J=sweep.offsets_J, correct_YxJ=exact.reshape(sweep.shape),
        token_accuracy_YxJ=tokens.reshape(sweep.shape),
        mean_distance=float(sweep.distance_N.mean()), phases_YxJ=phases,
        compression_ratio=ratio))
  return results


def compression_ratio(ends_NxT: np.ndarray) -> float:
  """Tokens per closed chunk over all rows (the open chunk at a row's end never closes)."""
  closed = float(np.sum(ends_NxT))
  return float(ends_NxT.size) / closed if closed else math.inf
