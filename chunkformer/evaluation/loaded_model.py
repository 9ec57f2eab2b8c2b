"""Sweeps and probes on a loaded (imported) model: the kv task spoken in its tokenizer's tokens.

The needle shift sweep and the prefix probe build rows from the kv task's abstract alphabet
(BOS, QUERY, filler, key/value symbols; ``chunkformer/data/kv.py``). A model imported with a
tokenizer (``chunkformer/convert/qwen3.py`` records it in ``pretrained.json``) never saw those
ids, so its predictor maps each abstract id to the id of one token string (``TokenStrings``:
by default newline as BOS, '?' as the query marker, ' ', '.', ',', '-' as filler, letters and
digits as symbols; each must be exactly one token of the tokenizer) and maps predictions back.
Rows are built as token ids, never re-tokenized from text, so offsets and phases stay counted
in tokens: the needle at offset o sits at RoPE position o and phase o mod M, as for models
trained here. Runs that start from an imported model (``init.from_workdir``) inherit its
tokenizer. A ``pretrained.json`` may override the strings with a ``token_strings`` object.

Tokenizer loading is one function, ``load_tokenizer``: the shared interface
``chunkformer.data.tokenizer.load`` when present, else ``tokenizers.Tokenizer`` directly.
"""

from __future__ import annotations

import dataclasses
import os
import string
from typing import Any

import numpy as np

from chunkformer.config import Config, ConfigError, DataConfig
from chunkformer.convert import qwen3
from chunkformer.data import kv
from chunkformer.evaluation import trained as trained_lib

_SYMBOLS = tuple(string.ascii_uppercase + string.ascii_lowercase + string.digits) + ("@", "#")


@dataclasses.dataclass(frozen=True)
class TokenStrings:
  """Token strings standing for the kv task's abstract tokens (each one token long)."""

  bos: str = "\n"
  query: str = "?"
  filler: tuple[str, ...] = (" ", ".", ",", "-")
  symbols: tuple[str, ...] = _SYMBOLS


def load_tokenizer(path: str):
  """A tokenizer with ``encode(text) -> list[int]`` and ``vocab_size``."""
  try:
    from chunkformer.data import tokenizer as tokenizer_lib  # the shared interface (data branch)
  except ImportError:
    tokenizer_lib = None
  if tokenizer_lib is not None:
    return tokenizer_lib.load(path)
  import tokenizers

  backend = tokenizers.Tokenizer.from_file(path)

  @dataclasses.dataclass(frozen=True)
  class _Plain:
    vocab_size: int = backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
      return backend.encode(text, add_special_tokens=False).ids

  return _Plain()


@dataclasses.dataclass(frozen=True)
class TokenMap:
  """kv id -> model token id (``to_model``), and back for predictions (``to_kv``, -1 = none)."""

  to_model: np.ndarray  # int32 [kv vocabulary]
  to_kv: np.ndarray  # int32 [model vocabulary]

  @classmethod
  def build(cls, tokenizer, strings: TokenStrings, data: DataConfig,
            model_vocab: int) -> TokenMap:
    """Raises ConfigError naming the string or field that does not map to one distinct token."""
    if data.task != "kv":
      raise ConfigError(f"config field 'data.task': sweeps of a loaded model build kv rows from "
                        f"token strings; got {data.task!r}")
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
    assert to_model.size == kv.vocab_size(data)
    to_kv = np.full(model_vocab, -1, np.int32)
    to_kv[to_model[1:]] = np.arange(1, to_model.size, dtype=np.int32)
    return cls(to_model, to_kv)


class MappedPredictor:
  """A ``trained.Predictor`` over kv rows for a model that speaks its tokenizer's ids."""

  def __init__(self, predictor: trained_lib.Predictor, token_map: TokenMap):
    self.predictor, self.token_map = predictor, token_map

  def __call__(self, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    mapped = dict(rows, inputs=self.token_map.to_model[rows["inputs"]])
    out = dict(self.predictor(mapped))
    out["predictions"] = self.token_map.to_kv[out["predictions"]]
    return out


def pretrained_record(workdir: str, config: Config) -> tuple[str, dict[str, Any]] | None:
  """(directory, pretrained.json) of the imported run ``workdir`` is or starts from, or None."""
  seen = set()
  while workdir and workdir not in seen:
    seen.add(workdir)
    record = qwen3.read_record(workdir)
    if record is not None:
      return workdir, record
    workdir = config.init.from_workdir
    if workdir and os.path.isfile(os.path.join(workdir, "config.json")):
      from chunkformer import workdir as workdir_lib

      config = workdir_lib.read_config(workdir)
  return None


def token_map(trained: trained_lib.TrainedModel) -> TokenMap | None:
  """The TokenMap of a loaded model with a tokenizer; None for models trained on kv ids."""
  found = pretrained_record(trained.workdir, trained.config)
  if found is None or not found[1].get("tokenizer"):
    return None
  directory, record = found
  strings = TokenStrings(**{k: tuple(v) if isinstance(v, list) else v
                            for k, v in (record.get("token_strings") or {}).items()})
  tokenizer = load_tokenizer(os.path.join(directory, record["tokenizer"]))
  return TokenMap.build(tokenizer, strings, trained.config.data, trained.config.model.vocab_size)


def adapt(trained: trained_lib.TrainedModel, predictor: trained_lib.Predictor):
  """``predictor``, mapped through the model's tokenizer if it was loaded with one."""
  mapping = token_map(trained)
  return predictor if mapping is None else MappedPredictor(predictor, mapping)
