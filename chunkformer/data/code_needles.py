"""Key-value needles planted into standard-library code (task "code", ``data.code_needles > 0``).

A needle row is ONE document (segment id 0, positions 0..T-1), because attention never crosses
documents and every query must be able to see every needle. Its T+1 tokens are:

  BOS, code bytes with the needle lines inserted, QUERY block 1, ..., QUERY block k

- code bytes: random stdlib files as in packed rows (the first from a random line start),
  joined by FILE_SEP instead of starting new documents, cut to fit;
- a needle is one line ``KEY_xxxx = "vvvv"\\n`` (``xxxx`` 4 random characters from [a-z0-9],
  unique within the row, ``vvvv`` 4 random letters from [a-z]), inserted at a random line start
  of the code (two needles may share one, then they are consecutive lines);
- a query block is QUERY followed by the same line: the model reads ``KEY_xxxx = "`` and must
  produce ``vvvv``. Every needle is asked once, in random order.

Scoring: ``loss_mask`` is 1 on every target inside the code (including FILE_SEP and the planted
lines) and on the 4 answer bytes of each query; the targets QUERY, the key prompt and the
closing ``"\\n`` are not scored. ``near_mask``/``far_mask`` split the answer bytes by the needle's
distance, index of the QUERY token minus index of the needle line's first byte, at
data.near_distance.
"""

from __future__ import annotations

import numpy as np

from chunkformer.config_sections.data import DataConfig
from chunkformer.data import code

KEY_CHARS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", np.uint8)
VALUE_CHARS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8)
KEY_SYMBOLS = 4  # random characters after "KEY_"
VALUE_SYMBOLS = 4  # random characters between the quotes (the answer)
PROMPT_LEN = len(b'KEY_') + KEY_SYMBOLS + len(b' = "')  # bytes before the answer
NEEDLE_LEN = PROMPT_LEN + VALUE_SYMBOLS + len(b'"\n')  # bytes of one needle line
QUERY_LEN = 1 + NEEDLE_LEN  # QUERY token and the needle line


def min_seq_len(config: DataConfig) -> int:
  """Shortest seq_len leaving at least one code byte next to the needles and queries."""
  return config.code_needles * (NEEDLE_LEN + QUERY_LEN) + 1


def _needle_lines(rng: np.random.Generator, count: int) -> list[np.ndarray]:
  keys: set[bytes] = set()
  lines = []
  while len(lines) < count:
    key = KEY_CHARS[rng.integers(len(KEY_CHARS), size=KEY_SYMBOLS)].tobytes()
    if key in keys:
      continue
    keys.add(key)
    value = VALUE_CHARS[rng.integers(len(VALUE_CHARS), size=VALUE_SYMBOLS)].tobytes()
    lines.append(np.frombuffer(b"KEY_" + key + b' = "' + value + b'"\n', np.uint8))
  return lines


def stream_len(seq_len: int, needles: int) -> int:
  """Code tokens (bytes and FILE_SEP) a needle row of seq_len holds besides needles and queries."""
  return seq_len + 1 - needles * QUERY_LEN - 1 - needles * NEEDLE_LEN


def make_row(rng: np.random.Generator, config: DataConfig, split: str) -> dict[str, np.ndarray]:
  """One needle row of [T] arrays with near/far masks (layout in the module docstring)."""
  code_len = stream_len(config.seq_len, config.code_needles)
  docs = code.documents(rng, code.load_corpus(split, config.heldout_fraction), code_len)
  separator = np.array([code.FILE_SEP], np.int32)
  stream = np.concatenate([docs[0]] + [np.concatenate([separator, d]) for d in docs[1:]])
  return plant(rng, stream[:code_len].astype(np.int32), seq_len=config.seq_len,
               needles=config.code_needles, near_distance=config.near_distance)


def plant(rng: np.random.Generator, stream: np.ndarray, *, seq_len: int, needles: int,
          near_distance: int) -> dict[str, np.ndarray]:
  """The needle row of a code ``stream`` (int32 bytes and FILE_SEP, ``stream_len`` tokens).

  Also the needle transform of the corpus pipeline (task "corpus", byte tokenizer), which
  packs documents into such streams.
  """
  k = needles
  length = seq_len + 1
  query_start = length - k * QUERY_LEN
  # Insertion points: before stream[i] where a line (or a file) starts.
  line_starts = np.flatnonzero(
      np.isin(np.concatenate([[ord("\n")], stream[:-1]]), (ord("\n"), code.FILE_SEP)))
  points = np.sort(rng.choice(line_starts, size=k))
  lines = _needle_lines(rng, k)
  pieces, offsets, cursor = [np.array([code.BOS], np.int32)], [], 0
  for j, point in enumerate(points):
    pieces.append(stream[cursor:point])
    cursor = point
    offsets.append(1 + point + j * NEEDLE_LEN)
    pieces.append(lines[j].astype(np.int32))
  pieces.append(stream[cursor:])
  order = rng.permutation(k)
  for j in order:
    pieces.append(np.concatenate([[code.QUERY], lines[j]]).astype(np.int32))
  tokens = np.concatenate(pieces)

  loss_mask = np.zeros(seq_len, np.float32)
  loss_mask[:query_start - 1] = 1.0  # code targets; the target at query_start - 1 is QUERY
  near = np.zeros(seq_len, np.float32)
  far = np.zeros(seq_len, np.float32)
  for q, j in enumerate(order):
    marker = query_start + q * QUERY_LEN
    answer = slice(marker + PROMPT_LEN, marker + PROMPT_LEN + VALUE_SYMBOLS)
    group = near if marker - offsets[j] <= near_distance else far
    group[answer] = 1.0
  return {
      "inputs": tokens[:-1],
      "targets": tokens[1:],
      "loss_mask": loss_mask + near + far,
      "positions": np.arange(seq_len, dtype=np.int32),
      "segment_ids": np.zeros(seq_len, np.int32),
      "near_mask": near,
      "far_mask": far,
  }
