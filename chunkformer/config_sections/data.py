"""The data section (``data``): which task, row length and batch size, and the task's knobs.

Only the fields' own checks live here. Whether a task's rows fit in ``seq_len``, which token ids
it emits and whether a corpus exists are known by the task modules, so those checks are
``chunkformer.data.check_config`` (which runs ``validate_fields`` first); ``Config.validate``
runs them for the whole run.
"""

from __future__ import annotations

import dataclasses

from chunkformer.config_sections.errors import one_of, require, require_positive

TASKS = ("kv", "lookup", "code", "corpus")


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Offline, deterministic data. Lengths in tokens."""

  # kv (synthetic key-value retrieval) | lookup (the paper's lookup prompts, data/lookup_rows.py)
  # | code (stdlib bytes) | corpus (shards)
  task: str = "kv"
  seq_len: int = 256  # T tokens per row
  batch_size: int = 32  # global rows per step (split over processes)
  # Key-value retrieval.
  num_pairs: int = 16  # key-value pairs planted per row
  key_len: int = 1  # tokens per key
  value_len: int = 1  # tokens per value
  num_queries: int = 4  # queries at the end of each row (training signal)
  num_symbols: int = 64  # distinct key/value symbol tokens
  num_filler: int = 4  # distinct filler tokens in the kv haystack
  near_distance: int = 64  # a needle within this many tokens of its query counts as near
  # Lookup prompts (task "lookup"): num_pairs records of 1-token keys and values from the kv
  # symbols, then this many demonstrations and the target key.
  lookup_demos: int = 8
  lookup_padding: str = "mixed"  # prefix | in_sequence | mixed (drawn per row)
  # random: each record's value drawn with replacement | distinct: distinct within a row, so
  # answering an undemonstrated record's value without reading the target's is worth
  # 1 / (num_pairs - lookup_demos) (data/lookup_shortcuts.py)
  lookup_values: str = "random"
  lookup_filler_kinds: int = 1  # filler tokens drawn per position (1: one repeated token)
  lookup_query: bool = False  # the kv query token before each demonstration and the target
  # Code corpus.
  code_needles: int = 0  # key-value needles planted into each row (code, or corpus of bytes)
  heldout_fraction: float = 0.1  # fraction of stdlib files (by path hash) held out
  # Ingested corpus (task "corpus", chunkformer/data/corpus.py).
  path: str = ""  # directory written by chunkformer.data.ingest, or "builtin:stdlib"
  tokenizer: str = ""  # must hash like the shards' ("" = theirs); builtin: "bytes" | "bpe:N"
  read_threads: int = 2  # Grain threads reading and decoding documents

  def validate_fields(self) -> None:
    """Checks of each field alone; the task checks are chunkformer.data.check_config."""
    one_of(self.task, TASKS, "data.task")
    require_positive(self, ("seq_len", "batch_size", "num_pairs", "key_len", "value_len",
                            "num_queries", "num_symbols"), "data")
    require(self.num_queries <= self.num_pairs, "data.num_queries",
            f"must be <= num_pairs ({self.num_pairs}), got {self.num_queries}")
    require(0.0 < self.heldout_fraction < 1.0, "data.heldout_fraction", "must lie in (0, 1)")
    require(self.code_needles >= 0, "data.code_needles", "must be >= 0")
    require(self.num_filler >= 1, "data.num_filler", f"must be >= 1, got {self.num_filler}")
    require(self.near_distance >= 0, "data.near_distance", "must be >= 0")
    one_of(self.lookup_padding, ("prefix", "in_sequence", "mixed"), "data.lookup_padding")
    one_of(self.lookup_values, ("random", "distinct"), "data.lookup_values")
    require(self.lookup_demos >= 0, "data.lookup_demos", "must be >= 0")
    require(self.lookup_filler_kinds >= 1, "data.lookup_filler_kinds", "must be >= 1")
    require(self.read_threads >= 0, "data.read_threads", "must be >= 0")
