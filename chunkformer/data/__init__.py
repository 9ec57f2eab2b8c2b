"""Offline, deterministic batches (docs/design.md section 7).

``make_batch`` returns this process's rows of the global batch as numpy arrays, all [B_local, T]
with T = data.seq_len:

- ``inputs``, ``targets`` (int32): tokens t and t+1 of one rendered row of T+1 tokens;
- ``loss_mask`` (float32): 1 where the target is scored;
- ``positions`` (int32): position inside the document, 0 at each document start;
- ``segment_ids`` (int32): document index per token (0, 1, ... along the row);
- retrieval rows only (task kv, or code with data.code_needles > 0): ``near_mask``,
  ``far_mask`` (float32): 1 on scored answer tokens whose needle lies within / beyond
  data.near_distance tokens of its query; near_mask + far_mask covers every answer token.

Determinism: global row r of a step is a pure function of (seed, split, step, r), drawn from
``row_rng``, so any number of processes sees the same global batch and a resumed run sees the
same data. Task modules: ``kv`` (synthetic retrieval and the sweep's layout tools), ``lookup_rows``
(the paper's lookup prompts as training rows) and ``code``
(the interpreter's own standard library, byte level, with optional planted needles).

Task ``corpus`` (``corpus.py``, ``feed.py``) reads ingested shards through a Grain pipeline
instead: its training batches come from a stateful iterator (``runtime`` holds a ``CorpusFeed``),
so ``make_batch`` serves only its held-out batches; they also carry ``target_bytes``.
"""

from __future__ import annotations

import functools
import json
import os

import numpy as np

from chunkformer.config_sections.data import DataConfig
from chunkformer.config_sections.errors import ConfigError
from chunkformer.data import builtin, code, code_needles, kv, lookup_rows

SPLITS = ("train", "heldout")


def vocab_size_needed(config: DataConfig) -> int:
  """Smallest model.vocab_size that covers every token id the task can emit."""
  if config.task in ("kv", "lookup"):
    return kv.vocab_size(config)
  if config.task == "corpus":
    return _corpus_vocab_size(config.path, config.tokenizer)
  return code.VOCAB_SIZE


def _corpus_vocab_size(path: str, tokenizer: str) -> int:
  if builtin.is_builtin(path):
    try:
      return builtin.check_spec(path, tokenizer)
    except ValueError as e:
      raise ConfigError(str(e)) from e
  manifest = os.path.join(path, "manifest.json")
  if not os.path.isfile(manifest):
    raise ConfigError(f"config field 'data.path': {path!r} holds no manifest.json (ingest it "
                      "with python -m chunkformer.data.ingest, or use 'builtin:stdlib')")
  try:
    with open(manifest) as f:
      return int(json.load(f)["tokenizer"]["vocab_size"])
  except (ValueError, KeyError, TypeError) as e:  # a damaged or foreign manifest.json
    raise ConfigError(f"config field 'data.path': {manifest!r} is not an ingested dataset's "
                      f"manifest ({type(e).__name__}: {e}); ingest the corpus again with "
                      "python -m chunkformer.data.ingest ... --overwrite") from None


def check_config(config: DataConfig) -> None:
  """Every check of the data section: its fields alone (``DataConfig.validate_fields``), then the
  task's (rows fit in data.seq_len, the corpus exists); raises ConfigError naming the field."""
  config.validate_fields()
  if config.task == "kv":
    if config.num_symbols**config.key_len < config.num_pairs:
      raise ConfigError(
          f"config field 'data.num_symbols': {config.num_symbols} symbols make only "
          f"{config.num_symbols**config.key_len} distinct keys of key_len {config.key_len}, "
          f"fewer than num_pairs ({config.num_pairs})")
    need = kv.min_seq_len(config)
    if config.seq_len < need:
      raise ConfigError(
          f"config field 'data.seq_len': {config.seq_len} tokens cannot hold {config.num_pairs} "
          f"needles of {kv.needle_len(config)} tokens, one filler between each, and "
          f"{config.num_queries} queries; need >= {need}")
  elif config.task == "lookup":
    lookup_rows.check(config)
  elif config.task == "corpus":
    if not config.path:
      raise ConfigError("config field 'data.path': task 'corpus' needs an ingested directory "
                        "or 'builtin:stdlib'")
    _corpus_vocab_size(config.path, config.tokenizer)
  if config.task not in ("kv", "lookup") and config.code_needles:
    need = code_needles.min_seq_len(config)
    if config.seq_len < need:
      raise ConfigError(
          f"config field 'data.code_needles': {config.code_needles} needles with their queries "
          f"need seq_len >= {need}, got {config.seq_len}")


def row_rng(seed: int, split: str, step: int, row: int) -> np.random.Generator:
  """The generator of global row ``row`` of ``step``; independent across all four arguments."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
  for name, value in (("seed", seed), ("step", step), ("row", row)):
    if value < 0:
      raise ValueError(f"{name} must be >= 0, got {value}")
  return np.random.default_rng(np.random.SeedSequence([seed, SPLITS.index(split), step, row]))


def make_row(config: DataConfig, *, seed: int, step: int, split: str,
             row: int) -> dict[str, np.ndarray]:
  """Global row ``row`` of ``step`` as [T] arrays (the batch contract without the B axis)."""
  rng = row_rng(seed, split, step, row)
  if config.task == "kv":
    return kv.make_row(rng, config)
  if config.task == "lookup":
    return lookup_rows.make_row(rng, config)
  if config.code_needles:
    return code_needles.make_row(rng, config, split)
  return code.make_row(rng, config, split)


def make_batch(config: DataConfig, *, seed: int, step: int, split: str,
               process_index: int = 0, process_count: int = 1) -> dict[str, np.ndarray]:
  """This process's rows [p*B/P, (p+1)*B/P) of the global batch of data.batch_size rows.

  Returns the arrays of the module docstring, each [B/P, data.seq_len]. Raises ValueError for
  an unknown split and ConfigError if process_count does not divide data.batch_size.
  """
  check_config(config)
  if config.task == "corpus":
    if split != "heldout":
      raise ValueError("task 'corpus' reads training batches in order through its Grain "
                       "iterator (runtime.Runtime.batch), not by step")
    return _heldout_feed(config, seed, process_index, process_count).batch("heldout", step)
  if split not in SPLITS:
    raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} outside [0, process_count={process_count})")
  if config.batch_size % process_count:
    raise ConfigError(
        f"config field 'data.batch_size': {config.batch_size} rows cannot be split evenly over "
        f"{process_count} processes")
  local = config.batch_size // process_count
  first = process_index * local
  rows = [make_row(config, seed=seed, step=step, split=split, row=r)
          for r in range(first, first + local)]
  return {key: np.stack([row[key] for row in rows]) for key in rows[0]}


@functools.lru_cache(maxsize=2)
def _heldout_feed(config: DataConfig, seed: int, process_index: int, process_count: int):
  from chunkformer.data import feed  # lazy: grain and array_record only for task corpus

  return feed.CorpusFeed(
      feed.open_for(config.path, config.tokenizer, config.heldout_fraction),
      seq_len=config.seq_len, rows=config.batch_size // process_count, seed=seed,
      shard_index=process_index, shard_count=process_count, read_threads=config.read_threads,
      needles=config.code_needles, near_distance=config.near_distance)
