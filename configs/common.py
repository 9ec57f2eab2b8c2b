"""Blocks of settings that several run configs share, each set by one call.

The small kv model, the key-value task of the study and the training schedule used to be
written out field by field in every config; one call per block keeps them from drifting apart.
A config passes only what it changes; a name that is not a field of the section is refused,
naming it (a bare ConfigDict would add it silently).
"""

from __future__ import annotations

from typing import Any

import ml_collections

# The kv_full / kv_chunk setting: 16 one-token pairs at random offsets in rows of 256 tokens, every
# pair queried at the end of the row (16 answers of training signal per row), 32 rows per batch;
# a needle more than 64 tokens before its query counts as far.
KV_TASK = dict(seq_len=256, batch_size=32, num_pairs=16, num_queries=16, near_distance=64)


def _set(section: ml_collections.ConfigDict, name: str, values: dict[str, Any]) -> None:
  unknown = sorted(set(values) - set(section.keys()))
  if unknown:
    raise KeyError(f"configs.common: {name} has no field(s) {unknown}; "
                   f"known: {sorted(section.keys())}")
  for key, value in values.items():
    section[key] = value


def kv_model(c: ml_collections.ConfigDict) -> None:
  """The model of the kv_full control and its compressed twins: 2 layers of width 64, 4 heads of 16
  channels (a quarter of them rotating: with all 16 rotating RoPE scrambles long-range content
  matching), MLP 256, vocabulary 128 (the kv task uses 71 ids; a round size for sharding)."""
  _set(c.model, "model", dict(num_layers=2, d_model=64, num_heads=4, num_kv_heads=4, head_dim=16,
                              mlp_dim=256, rope_fraction=0.25, vocab_size=128))


def kv_task(c: ml_collections.ConfigDict, **changes: Any) -> None:
  """Synthetic key-value retrieval (`data.task = "kv"`) with `KV_TASK`, updated by `changes`."""
  _set(c.data, "data", {"task": "kv", **KV_TASK, **changes})


def code_task(c: ml_collections.ConfigDict, *, batch_size: int, seq_len: int = 256) -> None:
  """Byte-level code (`data.task = "code"`): rows of `seq_len` bytes of the stdlib's source."""
  _set(c.data, "data", {"task": "code", "seq_len": seq_len, "batch_size": batch_size})


def schedule(c: ml_collections.ConfigDict, *, steps: int, learning_rate: float, warmup_steps: int,
             eval_every: int, checkpoint_every: int, log_every: int = 50,
             eval_batches: int = 8) -> None:
  """The training schedule: updates, peak learning rate, warmup (updates), and how often (in
  updates) to log, evaluate on `eval_batches` held-out batches and checkpoint."""
  _set(c.train, "train", dict(steps=steps, learning_rate=learning_rate, warmup_steps=warmup_steps,
                              log_every=log_every, eval_every=eval_every,
                              eval_batches=eval_batches, checkpoint_every=checkpoint_every))
