"""Byte-level code corpus (task "code"): the running interpreter's own standard library.

Corpus: every ``*.py`` file under ``sysconfig.get_paths()["stdlib"]``, skipping the directories
in ``EXCLUDED_DIRS`` (installed packages, test suites, caches) and empty files, in sorted
relative-path order. Nothing is downloaded, so every machine with Python 3.11+ has it; the exact
text follows the interpreter version, so compare runs on the same version. Files are split into
train / heldout by a stable hash of their relative path (``is_heldout``): a file's split never
depends on the machine, the interpreter's hash seed or the other files present.

Tokens: bytes 0..255, then the specials BOS 256 (document start), PAD 257 (reserved for padded
prompts; rows never contain it), QUERY 258 and FILE_SEP 259 (needle rows, see
``code_needles``); ``VOCAB_SIZE`` = 260.

Packed rows (``data.code_needles == 0``): documents are concatenated into T+1 tokens, each
document a BOS followed by file bytes. The first document of a row is the tail of a random file
from a random line start; the next ones are whole random files, the last one cut at the row end.
``segment_ids`` number the documents 0, 1, ... along the row, ``positions`` restart at 0 on each
BOS, and ``loss_mask`` is 1 on every target inside the same document as its input (targets that
are the next document's BOS are not scored).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import sysconfig

import numpy as np

from chunkformer.config_sections.data import DataConfig
from chunkformer.config_sections.errors import ConfigError

BOS = 256
PAD = 257
QUERY = 258
FILE_SEP = 259
VOCAB_SIZE = 260

EXCLUDED_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})


@dataclasses.dataclass(frozen=True, eq=False)
class Corpus:
  """Files of one split, concatenated: file i is ``data[starts[i]:starts[i + 1]]``."""

  paths: tuple[str, ...]  # relative POSIX paths, sorted
  data: bytes
  starts: np.ndarray  # int64 [len(paths) + 1] byte offsets

  def __len__(self) -> int:
    return len(self.paths)


def stdlib_root() -> str:
  return sysconfig.get_paths()["stdlib"]


def heldout_score(relative_path: str) -> float:
  """The first 8 bytes of sha256(path) read as a fraction in [0, 1): held out below the cut."""
  digest = hashlib.sha256(relative_path.encode("utf-8")).digest()
  return int.from_bytes(digest[:8], "big") / 2.0**64


def is_heldout(relative_path: str, heldout_fraction: float) -> bool:
  """Stable split: ``heldout_score(path) < heldout_fraction``."""
  return heldout_score(relative_path) < heldout_fraction


def stdlib_files(root: str) -> list[str]:
  """Relative POSIX paths of the corpus' ``*.py`` files under ``root``, sorted (empty included)."""
  found = []
  for directory, subdirs, names in os.walk(root):
    subdirs[:] = [d for d in subdirs if d not in EXCLUDED_DIRS]
    found.extend(os.path.relpath(os.path.join(directory, name), root).replace(os.sep, "/")
                 for name in names if name.endswith(".py"))
  return sorted(found)


@functools.lru_cache(maxsize=2)
def _all_files(root: str) -> tuple[tuple[str, bytes], ...]:
  files = []
  for relative in stdlib_files(root):
    with open(os.path.join(root, relative), "rb") as f:
      text = f.read()
    if text:
      files.append((relative, text))
  return tuple(files)


@functools.lru_cache(maxsize=4)
def load_corpus(split: str, heldout_fraction: float) -> Corpus:
  """The split's files, read once per process. Raises ConfigError if the split is empty."""
  want_heldout = split == "heldout"
  files = [(p, t) for p, t in _all_files(stdlib_root())
           if is_heldout(p, heldout_fraction) == want_heldout]
  if not files:
    raise ConfigError(
        f"config field 'data.heldout_fraction': {heldout_fraction} leaves no file of the "
        f"standard library in split {split!r}")
  sizes = np.array([len(t) for _, t in files], np.int64)
  return Corpus(paths=tuple(p for p, _ in files), data=b"".join(t for _, t in files),
                starts=np.concatenate([[0], np.cumsum(sizes)]))


def documents(rng: np.random.Generator, corpus: Corpus, length: int) -> list[np.ndarray]:
  """Random file bytes (uint8 arrays) whose lengths plus one token each reach ``length``.

  The first is the tail of a random file from a random line start, the rest whole random files;
  the caller cuts the last one.
  """
  docs = []
  total = 0
  while total < length:
    i = int(rng.integers(len(corpus)))
    start, stop = int(corpus.starts[i]), int(corpus.starts[i + 1])
    if not docs:
      newline = corpus.data.find(b"\n", start + int(rng.integers(stop - start)), stop - 1)
      start = start if newline < 0 else newline + 1
    docs.append(np.frombuffer(corpus.data, np.uint8, count=stop - start, offset=start))
    total += 1 + stop - start
  return docs


def positions_from_segments(segment_ids: np.ndarray) -> np.ndarray:
  """Index of each token inside its document (segment ids non-decreasing along the row)."""
  index = np.arange(len(segment_ids))
  starts = np.flatnonzero(np.diff(segment_ids, prepend=-1))
  return (index - np.repeat(starts, np.diff(np.append(starts, len(segment_ids))))).astype(np.int32)


def make_row(rng: np.random.Generator, config: DataConfig, split: str) -> dict[str, np.ndarray]:
  """One packed row of [T] arrays (no needles; see ``code_needles`` for those)."""
  length = config.seq_len + 1
  docs = documents(rng, load_corpus(split, config.heldout_fraction), length)
  tokens = np.concatenate([np.concatenate([[BOS], d]) for d in docs])[:length].astype(np.int32)
  segments = np.repeat(np.arange(len(docs), dtype=np.int32), [1 + len(d) for d in docs])[:length]
  return {
      "inputs": tokens[:-1],
      "targets": tokens[1:],
      "loss_mask": (segments[1:] == segments[:-1]).astype(np.float32),
      "positions": positions_from_segments(segments)[:-1],
      "segment_ids": segments[:-1],
  }
