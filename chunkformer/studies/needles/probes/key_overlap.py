"""Which part of the key a retrieval model reads: accuracy by the key tokens the asked needle
shares with another needle of its row.

Keys are unique within a row, but two keys may share their last (or first) tokens. A model that
matches the whole key does not care about such overlaps. A model that matches only the key's
last j tokens cannot tell the asked needle from another whose key ends in the same j tokens, so
it fails on those queries. A key token shift offers that shortcut: with width 2, the key at a
needle's first value token mixes in the needle's last key token, so one attention step finds
"the value after a key ending in b" without composing the whole key. Accuracy by the longest
suffix (and prefix) the asked key shares with any other key of its row tells the two apart:
flat for a whole-key reader, falling from suffix 0 to suffix >= 1 for a last-tokens reader.

Rows are fresh training-distribution rows (``kv.sample_layout``, ``data.num_queries`` queries),
so the share of each overlap class is what training saw: with 16 symbols and 6 needles about
28% of queries have another key ending in the same token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from chunkformer.config_sections.data import DataConfig
from chunkformer.data import kv
from chunkformer.evaluation.probes.base import ProbeContext, ProbeResult


def _common(a: Sequence[int], b: Sequence[int]) -> int:
  n = 0
  while n < min(len(a), len(b)) and a[n] == b[n]:
    n += 1
  return n


def shared_prefix(key: Sequence[int], others: Sequence[Sequence[int]]) -> int:
  """The longest run of leading tokens ``key`` shares with any of ``others`` (0 if none)."""
  return max((_common(key, o) for o in others), default=0)


def shared_suffix(key: Sequence[int], others: Sequence[Sequence[int]]) -> int:
  """The longest run of trailing tokens ``key`` shares with any of ``others`` (0 if none)."""
  return shared_prefix(key[::-1], [o[::-1] for o in others])


@dataclasses.dataclass(frozen=True)
class Outcome:
  """One query: how much of its key another needle shares, and whether it was answered."""

  suffix: int
  prefix: int
  right: tuple[bool, ...]  # per answer (value) token, in order

  @property
  def correct(self) -> bool:
    """The needle counts as retrieved: every answer token right."""
    return all(self.right)


def score(layouts: Sequence[kv.Layout], targets_NxT: np.ndarray,
          predictions_NxT: np.ndarray) -> list[Outcome]:
  """Every query of every row: the model's greedy predictions [N, T] against the rows' targets
  (``kv.render_many(layouts, ...)["targets"]``)."""
  out = []
  for layout, targets, predicted in zip(layouts, targets_NxT, predictions_NxT, strict=True):
    for span in kv.query_spans(layout):
      others = [k for i, k in enumerate(layout.keys) if i != span.pair]
      key = layout.keys[span.pair]
      right = predicted[span.answer_start:span.answer_stop] == targets[
          span.answer_start:span.answer_stop]
      out.append(Outcome(shared_suffix(key, others), shared_prefix(key, others),
                         tuple(bool(r) for r in right)))
  return out


@dataclasses.dataclass(frozen=True)
class Row:
  """Accuracy of the queries whose key shares ``shared`` tokens (suffix or prefix)."""

  shared: int
  queries: int
  needle_accuracy: float | None  # None without queries
  token_accuracy: tuple[float, ...] | None  # per answer token: is the first value token
  # right, the second, ... (a model that finds the needle but then follows the previous token
  # fails only the later ones)


def by_overlap(outcomes: Sequence[Outcome], key_len: int, side: str) -> list[Row]:
  """One row per overlap length 0 .. key_len - 1 (keys are unique: never key_len)."""
  if side not in ("suffix", "prefix"):
    raise ValueError(f"side must be 'suffix' or 'prefix', got {side!r}")
  rows = []
  for shared in range(key_len):
    mine = [o for o in outcomes if getattr(o, side) == shared]
    rows.append(Row(shared, len(mine),
                    float(np.mean([o.correct for o in mine])) if mine else None,
                    tuple(float(a) for a in np.mean([o.right for o in mine], axis=0))
                    if mine else None))
  return rows


def sample(config: DataConfig, num_rows: int, seed: int) -> list[kv.Layout]:
  """``num_rows`` fresh rows as in training (their own seed: not the training stream)."""
  rng = np.random.default_rng(seed)
  return [kv.sample_layout(rng, config) for _ in range(num_rows)]


def probe(context: ProbeContext, rows: int = 512, seed: int = 12345) -> ProbeResult:
  """The ``key_overlap`` entry of ``PROBES``: accuracy by the longest key suffix and prefix the
  asked needle shares with another of its row, on ``rows`` fresh rows (kv models; other tasks
  record None)."""
  config = context.trained.config
  if config.data.task != "kv":
    return ProbeResult(None)
  layouts = sample(config.data, rows, seed)
  rendered = kv.render_many(layouts, config.data)
  outcomes = score(layouts, rendered["targets"], context.predict(rendered)["predictions"])
  return ProbeResult({side: [dataclasses.asdict(r) for r in
                             by_overlap(outcomes, config.data.key_len, side)]
                      for side in ("suffix", "prefix")})
