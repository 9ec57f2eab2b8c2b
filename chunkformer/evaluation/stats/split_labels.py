"""Split labels of multi-token needles: how the chunk boundaries cut a needle, fixed in advance.

A needle is ``key_len`` key tokens k_1..k_a directly followed by ``value_len`` value tokens
v_1..v_b, its first key token at ``offset`` (``data/kv.py``). Chunks are contiguous runs of
tokens, each pooled into one compressed entry; a value token v_j is *linked* to a key token k_i
when both lie in the same chunk (one entry holds both, so matching the key can return that
value token). The label depends only on where chunk boundaries fall inside the needle: a
boundary at gap g (g = 1 .. a+b-1) separates needle token g-1 from token g (0-based), so gap a
separates the last key token from the first value token. The *kind*, from worst to best link:

- ``total``: a boundary at gap a. No value token is linked to any key token.
- ``value_cut``: no boundary at gap a, one inside the value (gap in a+1 .. a+b-1). The first
  value tokens share the last key token's chunk, the last value tokens share no chunk with any
  key token ("last value token cut").
- ``key_cut``: boundaries only inside the key (gap in 1 .. a-1). Every value token is linked
  to the last key tokens, none to the first ones ("first key token cut").
- ``none``: no boundary inside the needle; every value token is linked to every key token.

A needle cut both inside its key and inside its value is ``value_cut`` (the worst link wins).
The coarse *label* merges the two partial kinds: ``none`` / ``partial`` / ``total``. With
1-token keys and values only ``none`` and ``total`` occur (total iff offset mod M = M - 1 for
fixed chunks at origin 0); with 2-token keys and values at M = 4 the phases are none, value
cut, total, key cut (phases 0..3), at M = 2 total and value cut.

The labels describe entries of one chunking: they ignore the sliding window (a needle inside
the window is read raw, so labels matter for far needles), overlap (an overlapping entry pools
two chunks, linking tokens across one boundary) and per-head staggered offsets (give each
head's origin separately). Fixed chunks: token x lies in chunk ``floor((x - origin) / M)``.
Dynamic chunks: from the end flags the model used (``ends[t] = 1``: token t closes its chunk,
as ``needle_sweep.chunk_phases`` reads them).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from chunkformer.evaluation.stats.estimates import (
    _as_phases,
    _bootstrap_weights_RxY,
    _fail,
    _percentiles,
    as_correct_YxJ,
    bootstrap_mean_accuracy,
    phase_accuracy,
)

SPLIT_KINDS = ("none", "key_cut", "value_cut", "total")  # best to worst link
SPLIT_LABELS = ("none", "partial", "total")
COARSE = {"none": "none", "key_cut": "partial", "value_cut": "partial", "total": "total"}


def _check_lengths(key_len: int, value_len: int) -> None:
  if key_len < 1:
    _fail("key_len", f"must be >= 1, got {key_len}")
  if value_len < 1:
    _fail("value_len", f"must be >= 1, got {value_len}")


def _kinds_from_cuts(cut_NxG: np.ndarray, key_len: int) -> np.ndarray:
  """Kind per needle from its boundary flags at gaps 1 .. a+b-1 (column g-1 = gap g)."""
  total = cut_NxG[:, key_len - 1]
  value_cut = cut_NxG[:, key_len:].any(axis=1)
  key_cut = cut_NxG[:, :key_len - 1].any(axis=1)
  return np.select([total, value_cut, key_cut], ["total", "value_cut", "key_cut"],
                   default="none").astype(object)


def split_kinds_fixed(offsets, chunk_size: int, key_len: int, value_len: int,
                      origin: int = 0) -> np.ndarray:
  """Kind of each needle (module docstring) under fixed chunks of ``chunk_size`` tokens.

  Args:
    offsets: index of each needle's first key token, any shape.
    chunk_size: M; chunks start at ``origin + i * M``.
  Returns:
    An object array of kind names, the shape of ``offsets``.
  """
  _check_lengths(key_len, value_len)
  if chunk_size < 1:
    _fail("chunk_size", f"must be >= 1, got {chunk_size}")
  offsets = np.asarray(offsets, np.int64)
  gaps_G = np.arange(1, key_len + value_len)
  cut_NxG = np.mod(offsets.reshape(-1, 1) + gaps_G - origin, chunk_size) == 0
  return _kinds_from_cuts(cut_NxG, key_len).reshape(offsets.shape)


def phase_split_kinds(chunk_size: int, key_len: int, value_len: int) -> list[str]:
  """The kind of every phase 0 .. M-1 of fixed chunks: the labelling fixed before any data."""
  return list(split_kinds_fixed(np.arange(chunk_size), chunk_size, key_len, value_len))


def split_kinds_from_ends(ends_NxT, offsets_N, key_len: int, value_len: int) -> np.ndarray:
  """Kind of each row's needle from the end flags of that row's chunks (dynamic chunking).

  Args:
    ends_NxT: 1 where token t closes its chunk, per row.
    offsets_N: the needle's first key token in each row.
  Returns:
    An object array of kind names, [N].
  """
  _check_lengths(key_len, value_len)
  ends_NxT = np.asarray(ends_NxT)
  offsets_N = np.asarray(offsets_N, np.int64)
  if ends_NxT.ndim != 2 or offsets_N.shape != ends_NxT.shape[:1]:
    _fail("offsets_N", f"expected shape [{ends_NxT.shape[0] if ends_NxT.ndim else '?'}] beside "
          f"ends_NxT of shape [N, T], got {offsets_N.shape} and {ends_NxT.shape}")
  length = key_len + value_len
  if offsets_N.size and (offsets_N.min() < 0 or offsets_N.max() + length > ends_NxT.shape[1]):
    _fail("offsets_N", f"a needle of {length} tokens leaves the rows of {ends_NxT.shape[1]}")
  # A boundary at gap g: token offset + g - 1 closes its chunk.
  index_NxG = offsets_N[:, None] + np.arange(length - 1)[None, :]
  cut_NxG = np.take_along_axis(ends_NxT, index_NxG, axis=1) > 0
  return _kinds_from_cuts(cut_NxG, key_len)


def coarse_labels(kinds) -> np.ndarray:
  """none / partial / total for an array of kinds."""
  kinds = np.asarray(kinds, dtype=object)
  unknown = set(kinds.ravel()) - set(COARSE)
  if unknown:
    _fail("kinds", f"unknown split kinds {sorted(map(str, unknown))}; known: {SPLIT_KINDS}")
  return np.vectorize(COARSE.get, otypes=[object])(kinds) if kinds.size else kinds


def _label_codes(labels, names: tuple[str, ...], shape_YxJ: tuple[int, int]) -> np.ndarray:
  labels = np.asarray(labels, dtype=object)
  unknown = set(labels.ravel()) - set(names)
  if unknown:
    _fail("kinds", f"unknown labels {sorted(map(str, unknown))}; known: {names}")
  codes = np.vectorize(names.index, otypes=[np.int64])(labels)
  return _as_phases(codes, shape_YxJ)


def label_accuracy(correct_YxJ, labels, names: tuple[str, ...], *, num_resamples: int = 2000,
                   confidence: float = 0.95, seed: int = 0) -> dict[str, dict[str, Any]]:
  """Accuracy of each label with a haystack-bootstrap percentile interval.

  Args:
    correct_YxJ: outcomes in [0, 1], Y haystacks x J offsets.
    labels: one name of ``names`` per offset [J] or per trial [Y, J].
  Returns:
    ``{name: {"accuracy", "low", "high", "trials"}}`` for every name in ``names``; a label
    without trials has None numbers and 0 trials.
  """
  correct_YxJ = as_correct_YxJ(correct_YxJ)
  codes = np.broadcast_to(_label_codes(labels, names, correct_YxJ.shape), correct_YxJ.shape)
  onehot_YxJxL = codes[..., None] == np.arange(len(names))
  sums_YxL = np.einsum("sk,skl->sl", correct_YxJ, onehot_YxJxL)
  counts_YxL = onehot_YxJxL.sum(axis=1).astype(np.float64)
  weights_RxY = _bootstrap_weights_RxY(correct_YxJ.shape[0], num_resamples, seed)
  present_L = counts_YxL.sum(axis=0) > 0
  low_L, high_L = np.full(len(names), np.nan), np.full(len(names), np.nan)
  with np.errstate(invalid="ignore", divide="ignore"):
    samples_RxL = (weights_RxY @ sums_YxL[:, present_L]) / (weights_RxY @ counts_YxL[:, present_L])
  if present_L.any():
    low_L[present_L], high_L[present_L] = _percentiles(samples_RxL, confidence)
  out = {}
  for j, name in enumerate(names):
    trials = int(counts_YxL[:, j].sum())
    if trials == 0:
      out[name] = {"accuracy": None, "low": None, "high": None, "trials": 0}
      continue
    out[name] = {"accuracy": float(sums_YxL[:, j].sum() / trials), "low": float(low_L[j]),
                 "high": float(high_L[j]), "trials": trials}
  return out


def split_record(correct_YxJ, kinds, phases, *, num_resamples: int = 2000,
                 confidence: float = 0.95, seed: int = 0) -> dict[str, Any]:
  """The C5 table of one variant and depth: accuracy per split, mean accuracy and the gap.

  Args:
    correct_YxJ: outcomes in [0, 1].
    kinds: split kind per offset [J] or per trial [Y, J] (``split_kinds_fixed`` /
      ``split_kinds_from_ends``).
    phases: the phase grouping of the gap, [J] or [Y, J] (``offset mod M``, or the phase inside
      the actual chunk), as in ``estimates.phase_accuracy``.
  Returns:
    JSON-ready: ``by_label`` (none / partial / total) and ``by_kind`` (the four kinds), each
    ``{name: {"accuracy", "low", "high", "trials"}}``; ``mean_accuracy`` (+ ``_low`` /
    ``_high``); ``max_gap`` (+ basic interval, the ``phase_accuracy`` gap over ``phases``);
    and, for per-offset kinds and phases, ``kind_by_phase`` (phase -> kind; a phase with two
    kinds is listed with all of them).
  """
  correct_YxJ = as_correct_YxJ(correct_YxJ)
  boot = dict(num_resamples=num_resamples, confidence=confidence, seed=seed)
  kinds = np.asarray(kinds, dtype=object)
  by_phase = phase_accuracy(correct_YxJ, phases, **boot)
  mean = bootstrap_mean_accuracy(correct_YxJ, **boot)
  record = {
      "by_label": label_accuracy(correct_YxJ, coarse_labels(kinds), SPLIT_LABELS, **boot),
      "by_kind": label_accuracy(correct_YxJ, kinds, SPLIT_KINDS, **boot),
      "mean_accuracy": mean.mean, "mean_accuracy_low": mean.low,
      "mean_accuracy_high": mean.high,
      "max_gap": by_phase.gap.mean, "max_gap_low": by_phase.gap.low,
      "max_gap_high": by_phase.gap.high,
  }
  phases = np.asarray(phases)
  if kinds.ndim == 1 and phases.ndim == 1:
    table: dict[str, list[str]] = {}
    for phase, kind in zip(phases.tolist(), kinds.tolist(), strict=True):
      table.setdefault(str(int(phase)), [])
      if kind not in table[str(int(phase))]:
        table[str(int(phase))].append(kind)
    record["kind_by_phase"] = {p: k[0] if len(k) == 1 else k for p, k in sorted(
        table.items(), key=lambda item: int(item[0]))}
  return record
