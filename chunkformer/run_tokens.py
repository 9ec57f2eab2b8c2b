"""A run directory's tokens: the kv task spoken in a loaded model's tokens, and the tokenizer
a run speaks (``model_tokenizer``). It reads run directories (``pretrained.json``, the run's
config), so it sits beside ``workdir`` and ``config``, above ``data/``.

The kv task in a loaded model's tokens: one token string per abstract kv token.

The kv task (``chunkformer/data/kv.py``) draws rows from an abstract alphabet (PAD, BOS, QUERY,
filler, key/value symbols). A model imported with a tokenizer (``qwen3.py`` records it in
``pretrained.json``) never saw those ids, so each abstract id is mapped to the id of one token
string (``TokenStrings``: by default newline as BOS, '?' as the query marker, ' ', '.', ',', '-'
as filler, letters and digits as symbols; each must be exactly one distinct token of the
tokenizer; ``pretrained.json`` may override them with a ``token_strings`` object). Rows stay
token ids, never re-tokenized text, so offsets and phases are counted in tokens. Training
batches of a run started from such a model (``init.from_workdir``) are mapped the same way
(``Runtime.batch``), and so are the sweeps' rows
(``evaluation/probes/loaded_model.py``). Only the kv
task is mapped: other tasks feed their own ids, as they did in training.

Tokenizers load through ``chunkformer.data.tokenizer`` (the corpus pipeline's loader).
``model_tokenizer`` gives the tokenizer whose ids a run speaks: the corpus' tokenizer for a
model trained on task "corpus", else the tokenizer.json an imported checkpoint (or the run it
starts from) recorded.
"""

from __future__ import annotations

import dataclasses
import json
import os
import string
from typing import Any

import numpy as np

from chunkformer import workdir as workdir_lib
from chunkformer.config import Config, ConfigError, DataConfig
from chunkformer.data import tokenizer as tokenizer_lib

RECORD_FILE = "pretrained.json"  # written by chunkformer/convert/qwen3.py

_SYMBOLS = tuple(string.ascii_uppercase + string.ascii_lowercase + string.digits) + ("@", "#")


@dataclasses.dataclass(frozen=True)
class TokenStrings:
  """Token strings standing for the kv task's abstract tokens (each one token long)."""

  bos: str = "\n"
  query: str = "?"
  filler: tuple[str, ...] = (" ", ".", ",", "-")
  symbols: tuple[str, ...] = _SYMBOLS


def load_tokenizer(path: str) -> tokenizer_lib.Tokenizer:
  """The tokenizer at ``path`` (``tokenizer.json``), through the data pipeline's loader."""
  return tokenizer_lib.load(path)


@dataclasses.dataclass(frozen=True)
class TokenMap:
  """kv id -> model token id (``to_model``), and back for predictions (``to_kv``, -1 = none)."""

  to_model: np.ndarray  # int32 [kv vocabulary]
  to_kv: np.ndarray  # int32 [model vocabulary]

  @classmethod
  def build(cls, tokenizer, strings: TokenStrings, data: DataConfig,
            model_vocab: int) -> TokenMap:
    """Raises ConfigError naming the string or field that does not map to one distinct token."""
    for name, have, need in (("filler", strings.filler, data.num_filler),
                             ("symbols", strings.symbols, data.num_symbols)):
      if len(have) < need:
        raise ConfigError(f"config field 'data.num_{'filler' if name == 'filler' else 'symbols'}'"
                          f": {need} exceeds the {len(have)} token strings of {name}")
    named = [("bos", strings.bos), ("query", strings.query)]
    named += [(f"filler[{i}]", s) for i, s in enumerate(strings.filler[:data.num_filler])]
    named += [(f"symbols[{i}]", s) for i, s in enumerate(strings.symbols[:data.num_symbols])]
    ids, seen = [], {}
    for name, text in named:
      encoded = tokenizer.encode(text)
      if len(encoded) != 1:
        raise ConfigError(f"token string {name} = {text!r} is {len(encoded)} tokens "
                          f"{encoded} for this tokenizer; it must be exactly one")
      token = int(encoded[0])
      if not 0 <= token < model_vocab:
        raise ConfigError(f"token string {name} = {text!r} is id {token}, outside the model's "
                          f"vocabulary of {model_vocab}")
      if token in seen:
        raise ConfigError(f"token strings {seen[token]} and {name} are the same token {token}")
      seen[token] = name
      ids.append(token)
    # kv ids: PAD 0, BOS 1, QUERY 2, filler, symbols. PAD only pads after the last scored
    # target of a prefix-probe row (causally invisible); it reuses BOS's id.
    to_model = np.array([ids[0]] + ids, np.int32)
    to_kv = np.full(model_vocab, -1, np.int32)
    to_kv[to_model[1:]] = np.arange(1, to_model.size, dtype=np.int32)
    return cls(to_model, to_kv)

  def batch(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A kv batch with ``inputs`` and ``targets`` in the model's token ids."""
    return dict(batch, inputs=self.to_model[batch["inputs"]],
                targets=self.to_model[batch["targets"]])


def read_record(workdir: str) -> dict[str, Any] | None:
  """``pretrained.json`` of an imported run directory, or None."""
  path = os.path.join(workdir, RECORD_FILE)
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    return json.load(f)


def pretrained_record(workdir: str, config: Config) -> tuple[str, dict[str, Any]] | None:
  """(directory, pretrained.json) of the imported run that ``workdir`` (with ``config``) is or
  starts from through ``init.from_workdir`` links, or None. ``workdir`` may be "" (a run being
  set up: only its ``init.from_workdir`` chain is followed)."""
  seen = set()
  while True:
    record = read_record(workdir) if workdir else None
    if record is not None:
      return workdir, record
    workdir = config.init.from_workdir
    if not workdir or workdir in seen or not os.path.isfile(
        os.path.join(workdir, workdir_lib.CONFIG_FILE)):
      return None
    seen.add(workdir)
    config = workdir_lib.read_config(workdir)


def for_run(workdir: str, config: Config) -> TokenMap | None:
  """The TokenMap of a kv-task run that is, or starts from, a model with a tokenizer; else None.

  ``workdir`` may be "" (a run being set up: only ``init.from_workdir`` is followed).
  """
  if config.data.task != "kv":
    return None
  found = pretrained_record(workdir, config)
  if found is None or not found[1].get("tokenizer"):
    return None
  directory, record = found
  strings = TokenStrings(**{k: tuple(v) if isinstance(v, list) else v
                            for k, v in (record.get("token_strings") or {}).items()})
  tokenizer = load_tokenizer(os.path.join(directory, record["tokenizer"]))
  return TokenMap.build(tokenizer, strings, config.data, config.model.vocab_size)


def model_tokenizer(workdir: str, config) -> tokenizer_lib.Tokenizer | None:
  """The tokenizer whose ids the run in ``workdir`` (with ``config``) speaks, or None: the
  corpus' for task "corpus", else the tokenizer.json recorded by the imported checkpoint the
  run is or starts from (``pretrained_record``)."""
  if config.data.task == "corpus":
    from chunkformer.data import feed  # lazy: grain and array_record only for task corpus

    return feed.open_for(config.data.path, config.data.tokenizer,
                         config.data.heldout_fraction).tokenizer
  found = pretrained_record(workdir, config)
  if found is None or not found[1].get("tokenizer"):
    return None
  directory, record = found
  return tokenizer_lib.load(os.path.join(directory, record["tokenizer"]))
