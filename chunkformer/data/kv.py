"""Synthetic key-value retrieval (task "kv") and the layout tools of the periodicity sweep.

A row is rendered from T+1 tokens (``inputs = tokens[:-1]``, ``targets = tokens[1:]``):

  index 0                 BOS
  1 .. query_start-1      haystack: filler tokens with ``num_pairs`` needles at random offsets
  query_start .. T        ``num_queries`` query blocks of ``1 + key_len + value_len`` tokens:
                          QUERY, the asked needle's key tokens, its value tokens (the answer)

A needle (pair) is ``key_len`` key tokens directly followed by ``value_len`` value tokens, both
from the symbol alphabet. At least one filler token separates two needles, so a run of symbols
between fillers is exactly one needle and its first ``key_len`` tokens are the key: the task is
unambiguous although keys and values share one alphabet. Keys are unique within a row; values
are drawn independently (they may repeat). The gaps between needles are a uniformly random
composition of the free filler budget, so needle offsets (and hence every phase modulo any chunk
size) vary from row to row. Queries ask distinct needles in random order.

Scoring: ``loss_mask`` is 1 exactly on the targets that are answer (value) tokens, i.e. the
target indices ``[marker + key_len, marker + key_len + value_len)`` of every query block.
``near_mask``/``far_mask`` split those by the needle's distance ``marker - offset`` (index of
the QUERY token minus the index of the needle's first key token): near iff distance <=
``data.near_distance``. One document per row: ``positions`` are the indices 0..T-1 and
``segment_ids`` are 0, so a needle's offset is its RoPE position and its phase under fixed
chunks of step M (``chunk_offset`` 0) is ``offset % M``. With 1-token keys and values, key and
value land in different chunks exactly when ``offset % M == M - 1``.

Vocabulary (``vocab_size(config)`` ids in all, 71 for the defaults):
  PAD 0 (reserved for padded prompts), BOS 1, QUERY 2,
  filler ``FILLER_BASE .. FILLER_BASE + num_filler - 1``,
  symbols ``symbol_base(config) .. symbol_base(config) + num_symbols - 1``.

Sweep recipe (docs/design.md section 8): sample one layout whose reserved window holds no needle,
then move ONE needle through the window; every other token stays identical (tested). The rows
ask ``data.num_queries`` queries like training rows, the moved needle first::

  rng = np.random.default_rng(haystack_seed)
  start, stop = sweep_window(config, num_offsets=K, depth=0.5, num_queries=config.num_queries)
  base = with_first_query(sample_layout(rng, config, reserved=(start, stop)), 0)
  layouts = [with_pair_at(base, 0, start + k) for k in range(K)]
  batch = render_many(layouts, config)          # [K, T] arrays, one row per offset
  spans = [query_spans(l)[0] for l in layouts]  # answer target range and distance per row

A needle counts as retrieved when every target in its answer span is predicted correctly.
``depth`` 0 puts the window right after BOS (farthest from the queries), 1 right before the
queries; repeat over haystack seeds for the S samples of the protocol.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from chunkformer.config_sections.data import DataConfig

PAD = 0
BOS = 1
QUERY = 2
FILLER_BASE = 3


def symbol_base(config: DataConfig) -> int:
  """Id of the first key/value symbol (symbols follow the filler alphabet)."""
  return FILLER_BASE + config.num_filler


def vocab_size(config: DataConfig) -> int:
  """Token ids the kv task uses: specials, filler and symbols."""
  return symbol_base(config) + config.num_symbols


def needle_len(config: DataConfig) -> int:
  return config.key_len + config.value_len


def query_len(config: DataConfig) -> int:
  return 1 + needle_len(config)


def query_start(config: DataConfig, num_queries: int | None = None) -> int:
  """Index of the first QUERY token; the haystack is indices [1, query_start)."""
  if num_queries is None:
    num_queries = config.num_queries
  return config.seq_len + 1 - num_queries * query_len(config)


def min_seq_len(config: DataConfig) -> int:
  """Shortest seq_len holding BOS, the needles with one filler between each, and the queries."""
  n = config.num_pairs
  return n * needle_len(config) + (n - 1) + config.num_queries * query_len(config)


@dataclasses.dataclass(frozen=True)
class Layout:
  """Everything that determines one kv row; ``render`` turns it into arrays.

  Token ids are absolute vocabulary ids. ``filler`` holds a filler token for every index of
  the row (T+1 entries); indices covered by BOS, needles or queries ignore it, which is what
  keeps every other token identical when a needle moves.
  """

  keys: tuple[tuple[int, ...], ...]  # per needle, its key_len key tokens
  values: tuple[tuple[int, ...], ...]  # per needle, its value_len value tokens
  offsets: tuple[int, ...]  # per needle, index of its first key token
  queries: tuple[int, ...]  # needle index asked by each query block, in row order
  filler: tuple[int, ...]  # filler token per index, length T+1

  @property
  def length(self) -> int:
    """T+1: the rendered tokens (inputs plus the final target)."""
    return len(self.filler)

  @property
  def needle_len(self) -> int:
    return len(self.keys[0]) + len(self.values[0])

  @property
  def query_start(self) -> int:
    return self.length - len(self.queries) * (1 + self.needle_len)


@dataclasses.dataclass(frozen=True)
class QuerySpan:
  """Where one query's answer is scored, in target indices of the rendered row."""

  pair: int  # needle index asked
  marker: int  # index of the QUERY token
  answer_start: int  # first target index that is an answer token
  answer_stop: int  # one past the last
  distance: int  # marker - needle offset, in tokens
  offset: int  # needle offset (index = position of its first key token)


def _check_layout(layout: Layout) -> None:
  """Raises ValueError unless needles lie in the haystack, separated by >= 1 filler."""
  stop = layout.query_start
  spans = sorted((o, o + layout.needle_len, i) for i, o in enumerate(layout.offsets))
  for start, end, i in spans:
    if start < 1 or end > stop:
      raise ValueError(
          f"needle {i} at offset {start} leaves the haystack [1, {stop}) "
          f"(needle length {layout.needle_len})")
  for (_, end, i), (start, _, j) in zip(spans, spans[1:], strict=False):
    if start <= end:
      raise ValueError(f"needles {i} and {j} overlap or touch (no filler between them)")
  if len(set(layout.queries)) != len(layout.queries) or not all(
      0 <= q < len(layout.offsets) for q in layout.queries):
    raise ValueError(f"queries must be distinct needle indices, got {layout.queries}")


def _place(rng: np.random.Generator, count: int, start: int, stop: int, size: int) -> list[int]:
  """Random offsets of ``count`` items of ``size`` tokens in [start, stop), >= 1 token apart.

  The free tokens are split into count + 1 gaps by a uniformly random composition.
  """
  if count == 0:
    return []
  free = (stop - start) - count * size - (count - 1)
  if free < 0:
    raise ValueError(f"{count} needles of {size} tokens do not fit in [{start}, {stop})")
  slots = np.sort(rng.choice(free + count, size=count, replace=False))
  return [int(start + s + j * size) for j, s in enumerate(slots)]


def _capacity(length: int, size: int) -> int:
  return max(0, (length + 1) // (size + 1))


def sample_layout(
    rng: np.random.Generator,
    config: DataConfig,
    reserved: tuple[int, int] | None = None,
    num_queries: int | None = None,
) -> Layout:
  """Samples keys, values, offsets, filler and query order for one row.

  Args:
    rng: source of all randomness (the row is a pure function of its state).
    config: data.seq_len, num_pairs, key_len, value_len, num_symbols, num_filler.
    reserved: optional index interval [start, stop) kept free of needles, with one filler
      token of margin on both sides, so that ``with_pair_at`` can later move one needle to any
      offset in [start, stop - needle_len].
    num_queries: query blocks at the end of the row (default data.num_queries).

  Returns:
    A Layout of length seq_len + 1. Raises ValueError if the needles do not fit.
  """
  if num_queries is None:
    num_queries = config.num_queries
  n, size = config.num_pairs, needle_len(config)
  if not 1 <= num_queries <= n:
    raise ValueError(f"num_queries must lie in [1, num_pairs={n}], got {num_queries}")
  hay_stop = query_start(config, num_queries)
  if reserved is None:
    offsets = _place(rng, n, 1, hay_stop, size)
  else:
    start, stop = reserved
    if not 1 <= start < stop <= hay_stop:
      raise ValueError(f"reserved interval {reserved} must lie inside the haystack [1, {hay_stop})")
    # One filler of margin keeps the needle moved into the window apart from its neighbours.
    left = (1, start - 1)
    right = (stop + 1, hay_stop)
    cap_left = _capacity(left[1] - left[0], size)
    cap_right = _capacity(right[1] - right[0], size)
    if cap_left + cap_right < n:
      raise ValueError(
          f"{n} needles do not fit outside the reserved interval {reserved} (room for "
          f"{cap_left} before and {cap_right} after it)")
    share = cap_left / (cap_left + cap_right)
    n_left = int(np.clip(rng.binomial(n, share), n - cap_right, cap_left))
    offsets = _place(rng, n_left, *left, size) + _place(rng, n - n_left, *right, size)
  # Needle i's position must not follow its index, or the queried index would leak depth.
  offsets = [offsets[i] for i in rng.permutation(n)]
  base = symbol_base(config)
  keys: list[tuple[int, ...]] = []
  seen: set[tuple[int, ...]] = set()
  while len(keys) < n:
    key = tuple(int(t) for t in base + rng.integers(config.num_symbols, size=config.key_len))
    if key not in seen:
      seen.add(key)
      keys.append(key)
  values = [tuple(int(t) for t in base + rng.integers(config.num_symbols, size=config.value_len))
            for _ in range(n)]
  queries = rng.choice(n, size=num_queries, replace=False)
  filler = FILLER_BASE + rng.integers(config.num_filler, size=config.seq_len + 1)
  layout = Layout(keys=tuple(keys), values=tuple(values), offsets=tuple(offsets),
                  queries=tuple(int(q) for q in queries), filler=tuple(int(t) for t in filler))
  _check_layout(layout)
  return layout


def with_pair_at(layout: Layout, pair_index: int, offset: int) -> Layout:
  """The same layout with needle ``pair_index`` moved to ``offset`` (its first key token).

  Its old place reverts to the layout's filler, so two layouts that differ only in this
  offset are token-identical outside the two needle positions. Raises ValueError if the needle
  would leave the haystack or touch another needle.
  """
  offsets = list(layout.offsets)
  offsets[pair_index] = int(offset)
  moved = dataclasses.replace(layout, offsets=tuple(offsets))
  _check_layout(moved)
  return moved


def with_queries(layout: Layout, queries: Sequence[int]) -> Layout:
  """The same layout asking the given needles, in order (e.g. ``(i,)`` for one query).

  Fewer queries than before lengthen the haystack end; the needles stay where they are.
  """
  changed = dataclasses.replace(layout, queries=tuple(int(q) for q in queries))
  _check_layout(changed)
  return changed


def with_first_query(layout: Layout, pair_index: int) -> Layout:
  """The same layout with needle ``pair_index`` asked by the first query block.

  The number of queries stays. If the needle was asked already it moves to the front and the
  others keep their order; otherwise it replaces the last asked needle. Applied to a layout
  from ``sample_layout`` (uniformly random ordered queries) the other blocks ask a uniformly
  random ordered subset of the other needles, and no randomness is drawn.
  """
  others = [q for q in layout.queries if q != pair_index][:len(layout.queries) - 1]
  return with_queries(layout, (pair_index, *others))


def query_spans(layout: Layout) -> tuple[QuerySpan, ...]:
  """Per query block: the asked needle, its answer target range and its distance."""
  key_len = len(layout.keys[0])
  spans = []
  for j, pair in enumerate(layout.queries):
    marker = layout.query_start + j * (1 + layout.needle_len)
    answer_start = marker + key_len  # the target of the last key token is the first value
    spans.append(QuerySpan(
        pair=pair, marker=marker, answer_start=answer_start,
        answer_stop=answer_start + len(layout.values[pair]),
        distance=marker - layout.offsets[pair], offset=layout.offsets[pair]))
  return tuple(spans)


def render_tokens(layout: Layout) -> np.ndarray:
  """The T+1 token ids of a layout (int32)."""
  tokens = np.asarray(layout.filler, np.int32)
  tokens[0] = BOS
  for key, value, offset in zip(layout.keys, layout.values, layout.offsets, strict=True):
    tokens[offset:offset + len(key)] = key
    tokens[offset + len(key):offset + len(key) + len(value)] = value
  for span in query_spans(layout):
    pair = span.pair
    tokens[span.marker] = QUERY
    tokens[span.marker + 1:span.answer_start + 1] = layout.keys[pair]
    tokens[span.answer_start + 1:span.answer_stop + 1] = layout.values[pair]
  return tokens


def render(layout: Layout, config: DataConfig) -> dict[str, np.ndarray]:
  """One row as the batch contract's [T] arrays (see chunkformer/data/__init__.py).

  Uses data.near_distance for the near/far split; T = layout.length - 1.
  """
  tokens = render_tokens(layout)
  seq_len = layout.length - 1
  near = np.zeros(seq_len, np.float32)
  far = np.zeros(seq_len, np.float32)
  for span in query_spans(layout):
    group = near if span.distance <= config.near_distance else far
    group[span.answer_start:span.answer_stop] = 1.0
  return {
      "inputs": tokens[:-1],
      "targets": tokens[1:],
      "loss_mask": near + far,
      "positions": np.arange(seq_len, dtype=np.int32),
      "segment_ids": np.zeros(seq_len, np.int32),
      "near_mask": near,
      "far_mask": far,
  }


def render_many(layouts: Sequence[Layout], config: DataConfig) -> dict[str, np.ndarray]:
  """Rows of ``render`` stacked into [len(layouts), T] arrays."""
  rows = [render(layout, config) for layout in layouts]
  return {key: np.stack([row[key] for row in rows]) for key in rows[0]}


def sweep_window(config: DataConfig, *, num_offsets: int, depth: float,
                 num_queries: int = 1) -> tuple[int, int]:
  """Reserved interval [start, stop) in which one needle takes ``num_offsets`` offsets.

  The needle's offsets are ``start .. start + num_offsets - 1``. ``depth`` in [0, 1] slides
  the window from the haystack start (0, farthest from the queries) to its end (1, nearest).
  """
  if not 0.0 <= depth <= 1.0:
    raise ValueError(f"depth must lie in [0, 1], got {depth}")
  width = num_offsets - 1 + needle_len(config)
  hay_stop = query_start(config, num_queries)
  room = hay_stop - 1 - width
  if room < 0:
    raise ValueError(f"a window of {num_offsets} offsets does not fit in the haystack "
                     f"[1, {hay_stop})")
  start = 1 + int(round(depth * room))
  return start, start + width


def make_row(rng: np.random.Generator, config: DataConfig) -> dict[str, np.ndarray]:
  """One training/evaluation row: a freshly sampled layout, rendered."""
  return render(sample_layout(rng, config), config)
