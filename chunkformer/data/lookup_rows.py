"""Training rows of task "lookup": the position-matched lookup test's prompts, as training data.

A small model does not learn in-context lookup from a few hundred steps of byte-level text, so
at CPU size the paper's runs train on the lookup prompts themselves (``lookup_task``), the way
the needle study trains on its retrieval task. A row is one prompt of ``data.seq_len`` tokens
followed by its answer (T+1 rendered tokens, ``inputs = tokens[:-1]``):

  [BOS]  R = data.num_pairs records (key value) in filler  filler  D demonstrations  target key

Differences from the test prompts, all chosen so the test measures what training taught:
- the target key's position is uniform over every position a prompt allows (the test draws it
  per residue group with matched moments), so no phase is seen more often than another;
- the padding mode is drawn per row (``data.lookup_padding = "mixed"``, the default) or fixed;
- the loss is on every demonstration's value and the final answer: D + 1 lookups per row, each
  answerable only by finding its key among the records.

Layout options, both off in the committed sweeps: ``data.lookup_filler_kinds`` filler tokens drawn
per position (of the vocabulary's ``data.num_filler``) instead of one repeated token, and
``data.lookup_query``, the kv task's query token before each demonstration and the target key.

Vocabulary: the kv task's (BOS, filler ``kv.FILLER_BASE``, ``data.num_symbols`` symbols, the
first half keys and the second half values), so ``lookup_task.default_tokens`` and the probes
read a lookup model exactly like a kv model.
"""

from __future__ import annotations

import numpy as np

from chunkformer.config_sections.data import DataConfig
from chunkformer.config_sections.errors import ConfigError
from chunkformer.data import kv, lookup_task

PADDINGS = lookup_task.PADDINGS + ("mixed",)


def spec(config: DataConfig, padding: str = "prefix") -> lookup_task.LookupSpec:
  """The prompt layout of ``config``'s rows (modulus 1: training does not match residues)."""
  tokens = lookup_task.default_tokens(config)
  return lookup_task.LookupSpec(
      seq_len=config.seq_len, keys=tokens["keys"], values=tokens["values"],
      filler=tokens["filler"], bos=tokens["bos"], num_records=config.num_pairs,
      num_demos=config.lookup_demos, modulus=1, prompts_per_residue=1, padding=padding,
      distinct_values=config.lookup_values == "distinct",
      filler_kinds=config.lookup_filler_kinds,
      query=kv.QUERY if config.lookup_query else None)


def check(config: DataConfig) -> None:
  """ConfigError naming the data field when the rows cannot be laid out."""
  if config.lookup_demos >= config.num_pairs:
    raise ConfigError(f"config field 'data.lookup_demos': {config.lookup_demos} demonstrations "
                      f"need more records (data.num_pairs = {config.num_pairs})")
  layout = spec(config)
  if config.lookup_filler_kinds > config.num_filler:
    raise ConfigError(f"config field 'data.lookup_filler_kinds': {config.lookup_filler_kinds} "
                      f"filler tokens, but the vocabulary has data.num_filler = "
                      f"{config.num_filler}")
  if config.num_symbols // 2 < config.num_pairs:
    raise ConfigError(f"config field 'data.num_symbols': {config.num_symbols} symbols give "
                      f"{config.num_symbols // 2} keys (the first half), fewer than the "
                      f"{config.num_pairs} records of data.num_pairs")
  if layout.distinct_values and config.num_symbols - config.num_symbols // 2 < config.num_pairs:
    raise ConfigError(f"config field 'data.lookup_values': 'distinct' needs a value per record: "
                      f"{config.num_symbols} symbols give "
                      f"{config.num_symbols - config.num_symbols // 2} values (the second "
                      f"half), fewer than the {config.num_pairs} records of data.num_pairs")
  if layout.free_filler < 0:
    need = layout.seq_len - layout.free_filler
    raise ConfigError(f"config field 'data.seq_len': {config.seq_len} tokens cannot hold "
                      f"{config.num_pairs} records, a filler and {config.lookup_demos} "
                      f"demonstrations with the target key; need >= {need}")


def make_row(rng: np.random.Generator, config: DataConfig) -> dict[str, np.ndarray]:
  """One row of the batch contract (``chunkformer.data``) from ``rng``."""
  padding = config.lookup_padding
  if padding == "mixed":
    padding = lookup_task.PADDINGS[int(rng.integers(len(lookup_task.PADDINGS)))]
  layout = spec(config, padding)
  t = config.seq_len
  tokens = layout.blank(rng, (t + 1,))
  t_k = int(rng.integers(layout.start, layout.start + layout.free_filler
                         + 2 * layout.num_records - 1))
  tokens[t], _ = lookup_task.place(rng, layout, t_k, tokens[:t])
  loss_mask = np.zeros(t, np.float32)
  loss_mask[layout.demo_key_positions] = 1.0  # the target at a demonstration key is its value
  loss_mask[t - 1] = 1.0  # the answer after the target key
  return {"inputs": tokens[:-1], "targets": tokens[1:], "loss_mask": loss_mask,
          "positions": np.arange(t, dtype=np.int32), "segment_ids": np.zeros(t, np.int32)}
