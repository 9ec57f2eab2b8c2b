"""Lookup and needle vocabularies of real words: single-token words of a model's tokenizer.

The paper's lookup prompts pair single-token words (an animal key, a name value), so that the
task reads like text to a pretrained model. ``choose`` picks such words from a loaded model's
own tokenizer: token ids whose text is a space-prefixed ASCII word of at least ``MIN_LETTERS``
letters (" cat", " Anna": the byte-level BPE convention of Qwen3 and of the tokenizers
``chunkformer.data.tokenizer`` trains) and whose text encodes back to exactly that one id. A
seeded permutation of those words, sorted by id first, is split into disjoint key and value
sets, so the same tokenizer and seed always give the same sets. The filler is the first of
``FILLER_TEXTS`` that is one token; BOS is the tokenizer's document-start token (the one the
corpus pipeline puts before every document), if it has one inside the model's vocabulary.
``word_ids`` takes a curated list instead (the paper drew animal keys and name values).
The tokenizer a run speaks is found by ``chunkformer.run_tokens.model_tokenizer``. All ids are
the model's own: rows built from them are fed unmapped.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from chunkformer.data import tokenizer as tokenizer_lib

MIN_LETTERS = 2  # one-letter tokens (" s", " x") are more often word pieces than words
FILLER_TEXTS = ("\n", " ")  # filler candidates, in order of preference
_WORD = re.compile(rf" [A-Za-z]{{{MIN_LETTERS},}}")


@dataclasses.dataclass(frozen=True)
class WordTokens:
  """Disjoint single-token word ids for keys and values, a filler id and BOS (model ids)."""

  keys: tuple[int, ...]
  values: tuple[int, ...]
  filler: int
  bos: int | None

  def as_dict(self) -> dict[str, object]:
    return dataclasses.asdict(self)


def single_token_words(tokenizer: tokenizer_lib.Tokenizer, model_vocab: int) -> list[int]:
  """Sorted ids below ``model_vocab`` whose text is a space-prefixed word that encodes back to
  exactly that id (special tokens decode to "" and never qualify)."""
  if tokenizer.backend is None:  # byte level: one byte per id, never a word
    return []
  size = min(tokenizer.vocab_size, model_vocab)
  texts = tokenizer.backend.decode_batch([[i] for i in range(size)], skip_special_tokens=True)
  candidates = [(i, t) for i, t in enumerate(texts) if _WORD.fullmatch(t)]
  if not candidates:
    return []
  encoded = tokenizer.backend.encode_batch([t for _, t in candidates], add_special_tokens=False)
  return [i for (i, _), e in zip(candidates, encoded, strict=True) if e.ids == [i]]


def single_token(tokenizer: tokenizer_lib.Tokenizer, text: str, model_vocab: int) -> int | None:
  """The id ``text`` encodes to if it is one token inside the model's vocabulary, else None."""
  ids = tokenizer.encode(text)
  return int(ids[0]) if len(ids) == 1 and 0 <= ids[0] < model_vocab else None


def word_ids(tokenizer: tokenizer_lib.Tokenizer, words, model_vocab: int,
             field: str) -> tuple[int, ...]:
  """Ids of given words (a curated list, as the paper's animals and names): each text, with a
  leading space added if it has none, must be one token of the model's vocabulary; ints pass
  as ids. ValueError naming ``field`` and the word otherwise."""
  out = []
  for word in words:
    if not isinstance(word, str):
      out.append(int(word))
      continue
    text = word if word.startswith(" ") else " " + word
    token = single_token(tokenizer, text, model_vocab)
    if token is None:
      raise ValueError(f"{field}: {text!r} is not one token of tokenizer {tokenizer.name!r} "
                       f"inside the model's vocabulary of {model_vocab} (it encodes to "
                       f"{tokenizer.encode(text)})")
    out.append(token)
  return tuple(out)


def filler_and_bos(tokenizer: tokenizer_lib.Tokenizer, model_vocab: int) -> tuple[int, int | None]:
  """The first of ``FILLER_TEXTS`` that is one token, and the document-start token if the
  model has it; ValueError naming ``filler`` when none is one token."""
  filler = next((f for f in (single_token(tokenizer, t, model_vocab) for t in FILLER_TEXTS)
                 if f is not None), None)
  if filler is None:
    raise ValueError(f"filler: none of {', '.join(map(repr, FILLER_TEXTS))} is one token of "
                     f"tokenizer {tokenizer.name!r}; give filler (a token id)")
  bos = tokenizer.bos_id
  return filler, bos if bos is not None and bos < model_vocab else None


def choose(tokenizer: tokenizer_lib.Tokenizer, model_vocab: int, *, seed: int = 0,
           num_keys: int = 0, num_values: int = 0, exclude=(),
           draw: tuple[str, ...] = ("keys", "values")) -> WordTokens:
  """``num_keys`` key and ``num_values`` value words, disjoint, drawn by ``seed`` from the
  single-token words not in ``exclude`` (both 0: every word found, split in halves; one 0: as
  many as the other); only the sets named in ``draw`` (the other is empty; its count 0 means
  every word). ValueError naming the field when the tokenizer has too few words or no
  single-token filler."""
  if num_keys < 0 or num_values < 0:
    raise ValueError("num_keys: counts of words must be >= 0")
  excluded = {int(i) for i in exclude}
  words = [i for i in single_token_words(tokenizer, model_vocab) if i not in excluded]
  if "keys" not in draw:
    num_keys, num_values = 0, num_values or len(words)
  elif "values" not in draw:
    num_keys, num_values = num_keys or len(words), 0
  elif not num_keys and not num_values:
    num_keys = num_values = len(words) // 2
  else:
    num_keys, num_values = num_keys or num_values, num_values or num_keys
  need = max(num_keys + num_values, len(draw))  # at least one word in every set drawn
  if len(words) < need:
    raise ValueError(
        f"num_keys: {num_keys} keys and {num_values} values need {need}"
        f" single-token words; tokenizer {tokenizer.name!r} has {len(words)} within the model's "
        f"vocabulary of {model_vocab} (space-prefixed words of >= {MIN_LETTERS} ASCII letters "
        "that encode back to one token" + (", less those given" if excluded else "") + ")")
  order = np.asarray(words)[np.random.default_rng(seed).permutation(len(words))]
  keys = tuple(sorted(int(i) for i in order[:num_keys]))
  values = tuple(sorted(int(i) for i in order[num_keys:num_keys + num_values]))
  return WordTokens(keys, values, *filler_and_bos(tokenizer, model_vocab))
