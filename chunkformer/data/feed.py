"""The corpus task's batch feed: a stateful Grain iterator for training, cached held-out batches.

The synthetic tasks (kv, code) compute any batch from (seed, split, step); a corpus is read in
order, so ``CorpusFeed.batch("train", step)`` must be called for consecutive steps, and the
iterator's Grain state goes into the checkpoint (``checkpoint_items``) to resume exactly.
Held-out batch i is the i-th batch of the unshuffled held-out pipeline, read once and cached.
"""

from __future__ import annotations

import atexit
import weakref
from typing import Any

import numpy as np

from chunkformer.config_sections.errors import ConfigError
from chunkformer.data import builtin, corpus, ingest
from chunkformer.data import tokenizer as tokenizer_lib


def dataset_directory(path: str, tokenizer: str, heldout_fraction: float) -> str:
  """The ingested directory of ``data.path`` (building the built-in corpus if needed)."""
  if builtin.is_builtin(path):
    return builtin.resolve(path, tokenizer, heldout_fraction)
  return path


def open_for(path: str, tokenizer: str, heldout_fraction: float) -> corpus.Dataset:
  """The dataset of data.path, data.tokenizer; raises ConfigError naming the field."""
  spec = "" if builtin.is_builtin(path) else tokenizer
  try:
    return corpus.open_dataset(dataset_directory(path, tokenizer, heldout_fraction), spec)
  except tokenizer_lib.TokenizerError as e:
    raise ConfigError(f"config field 'data.tokenizer': {e}") from e
  except ingest.IngestError as e:
    raise ConfigError(f"config field 'data.path': {e}") from e


# Feeds with iterators still open. Grain's prefetch iterators stop their threads in __del__,
# which fails (AttributeError on a torn-down module) when it first runs during interpreter
# shutdown; closing what is left at exit, while modules still exist, avoids that.
_OPEN_FEEDS: weakref.WeakSet[CorpusFeed] = weakref.WeakSet()


@atexit.register
def _close_open_feeds() -> None:
  for feed in list(_OPEN_FEEDS):
    feed.close()


class CorpusFeed:
  """This process's rows of the corpus batches (see module docstring)."""

  def __init__(self, dataset: corpus.Dataset, *, seq_len: int, rows: int, seed: int,
               shard_index: int, shard_count: int, read_threads: int, needles: int = 0,
               near_distance: int = 0):
    self.dataset = dataset
    kwargs = dict(seq_len=seq_len, rows=rows, seed=seed, shard_index=shard_index,
                  shard_count=shard_count, read_threads=read_threads, needles=needles,
                  near_distance=near_distance)
    try:
      self._pipelines = {s: corpus.pipeline(dataset, s, **kwargs) for s in ("train", "heldout")}
    except ingest.IngestError as e:
      raise ConfigError(f"config field 'data.code_needles': {e}") from e
    self._train_iterator = None
    self.next_step = 0
    self._heldout: list[dict[str, np.ndarray]] = []
    self._heldout_iterator = None
    _OPEN_FEEDS.add(self)

  @property
  def train_iterator(self):
    """The training iterator (made on first use: evaluation alone never reads the train split)."""
    if self._train_iterator is None:
      self._train_iterator = iter(self._pipelines["train"])
    return self._train_iterator

  def batch(self, split: str, step: int) -> dict[str, np.ndarray]:
    if split == "train":
      if step != self.next_step:
        raise RuntimeError(f"corpus batches are read in order: step {step} requested, the "
                           f"training iterator is at step {self.next_step}")
      self.next_step += 1
      return next(self.train_iterator)
    if split != "heldout":
      raise ValueError(f"split must be train or heldout, got {split!r}")
    if self._heldout_iterator is None:
      self._heldout_iterator = iter(self._pipelines["heldout"])
    while len(self._heldout) <= step:
      self._heldout.append(next(self._heldout_iterator))
    return self._heldout[step]

  def info(self) -> dict[str, Any]:
    """What the checkpoint records about the data (checked when resuming)."""
    return {"directory": self.dataset.directory, "tokenizer_hash": self.dataset.hash}

  def resumed(self, step: int, info: dict[str, Any]) -> None:
    """The iterator state of checkpoint ``step`` was restored; refuses other shards."""
    try:
      tokenizer_lib.check_hash(info["tokenizer_hash"], self.dataset.tokenizer,
                               f"the checkpoint at step {step}")
    except tokenizer_lib.TokenizerError as e:
      raise ConfigError(f"config field 'data.path': {e}") from e
    self.next_step = step

  def close(self) -> None:
    for it in (self._train_iterator, self._heldout_iterator):
      if it is not None and hasattr(it, "close"):
        it.close()
    self._train_iterator = self._heldout_iterator = None
    _OPEN_FEEDS.discard(self)
