"""Tokenizers: byte level (the code task's) and any Hugging Face ``tokenizers`` tokenizer.json.

``load(spec)`` takes "bytes" or a path to a tokenizer.json; both give a ``Tokenizer`` with
``encode(text) -> list[int]``, ``decode(ids) -> str``, ``vocab_size``, ``hash`` (a stable
content hash: it travels with ingested shards and with runs, and a mismatch is refused), ``name``,
``bos_id`` (the id that starts every packed document, or None) and ``token_bytes()`` (the UTF-8
bytes each id stands for, so that losses convert to bits per byte comparably across tokenizers).

Byte level: ids 0..255 are the bytes of the UTF-8 text, then the code task's specials BOS 256,
PAD 257, QUERY 258, FILE_SEP 259 (vocab_size 260), so byte-level corpora and the code task share
one vocabulary.

Training a byte-level BPE offline (no download; every byte stays encodable):

  python -m chunkformer.data.tokenizer train --input 'DIR/**/*.py' --vocab_size 4096 \\
      --output tok.json
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import hashlib
import json
import os
import sys
from collections.abc import Iterator, Sequence

import numpy as np
import tokenizers
from absl import logging

BYTES = "bytes"
BYTE_BOS = 256
BYTE_VOCAB_SIZE = 260
BPE_BOS = "<|bos|>"  # the special token a trained BPE reserves as id 0
# Names under which tokenizer.json files commonly carry a document-start token, tried in order.
BOS_CANDIDATES = (BPE_BOS, "<|endoftext|>", "<s>", "<bos>", "<|begin_of_text|>")


class TokenizerError(ValueError):
  """A tokenizer spec or file that cannot be used (names the path)."""


@dataclasses.dataclass(frozen=True, eq=False)
class Tokenizer:
  """A loaded tokenizer (see module docstring). ``backend`` is None for byte level."""

  name: str
  hash: str
  vocab_size: int
  bos_id: int | None
  backend: tokenizers.Tokenizer | None = None

  def encode(self, text: str) -> list[int]:
    if self.backend is None:
      return list(text.encode("utf-8"))
    return self.backend.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Sequence[int]) -> str:
    """Text of ``ids``; byte level drops the special ids (>= 256) and keeps every byte."""
    if self.backend is None:
      return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")
    return self.backend.decode([int(i) for i in ids], skip_special_tokens=True)

  def token_bytes(self) -> np.ndarray:
    """float32 [vocab_size]: UTF-8 bytes each id stands for (0 for special tokens)."""
    if self.backend is None:
      return np.concatenate([np.ones(256), np.zeros(BYTE_VOCAB_SIZE - 256)]).astype(np.float32)
    out = np.zeros(self.vocab_size, np.float32)
    special = {t.content for t in self.backend.get_added_tokens_decoder().values() if t.special}
    byte_level = _byte_level_alphabet(self.backend)
    for i in range(self.vocab_size):
      piece = self.backend.id_to_token(i)
      if piece is None or piece in special:
        continue
      if byte_level is not None and all(ch in byte_level for ch in piece):
        out[i] = len(piece)  # one character of the byte-level alphabet per byte
      else:
        out[i] = len(self.backend.decode([i]).encode("utf-8"))
    return out


def _byte_level_alphabet(backend: tokenizers.Tokenizer) -> frozenset[str] | None:
  spec = json.loads(backend.to_str()).get("pre_tokenizer") or {}
  kinds = [spec.get("type")] + [p.get("type") for p in spec.get("pretokenizers", [])]
  if "ByteLevel" not in kinds:
    return None
  return frozenset(tokenizers.pre_tokenizers.ByteLevel.alphabet())


def _digest(text: str) -> str:
  return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def byte_tokenizer() -> Tokenizer:
  return Tokenizer(name=BYTES, hash=_digest("chunkformer-bytes-v1:256+BOS,PAD,QUERY,FILE_SEP"),
                   vocab_size=BYTE_VOCAB_SIZE, bos_id=BYTE_BOS)


def load(spec: str) -> Tokenizer:
  """"bytes" or the path of a tokenizer.json; raises TokenizerError naming the path."""
  if spec == BYTES:
    return byte_tokenizer()
  if not os.path.isfile(spec):
    raise TokenizerError(f"tokenizer {spec!r}: no such file (give 'bytes' or a tokenizer.json)")
  try:
    backend = tokenizers.Tokenizer.from_file(spec)
  except Exception as e:  # noqa: BLE001 -- the library raises bare Exception on bad JSON
    raise TokenizerError(f"tokenizer {spec!r} is not a tokenizers JSON file: {e}") from e
  # The canonical serialisation, not the file bytes: reformatting the JSON keeps the hash.
  vocab = backend.get_vocab(with_added_tokens=True)
  bos = next((vocab[t] for t in BOS_CANDIDATES if t in vocab), None)
  return Tokenizer(name=os.path.basename(spec), hash=_digest(backend.to_str()),
                   vocab_size=backend.get_vocab_size(with_added_tokens=True), bos_id=bos,
                   backend=backend)


def check_hash(expected: str, tokenizer: Tokenizer, where: str) -> None:
  """Refuses a tokenizer whose hash differs from the one ``where`` was made with."""
  if expected != tokenizer.hash:
    raise TokenizerError(
        f"{where} was tokenized with tokenizer hash {expected}, but tokenizer "
        f"{tokenizer.name!r} has hash {tokenizer.hash}; use the tokenizer the data was "
        "ingested with, or re-ingest")


def expand_glob(pattern: str) -> list[str]:
  """Sorted files matching ``pattern`` (``**`` recurses); raises TokenizerError if none."""
  paths = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
  if not paths:
    raise TokenizerError(f"--input {pattern!r} matches no file")
  return paths


def _texts(paths: Sequence[str]) -> Iterator[str]:
  skipped = 0
  for path in paths:
    with open(path, "rb") as f:
      raw = f.read()
    try:
      yield raw.decode("utf-8")
    except UnicodeDecodeError:
      skipped += 1
      if skipped <= 3:
        logging.warning("skipping %s: not UTF-8 text", path)
  if skipped:
    logging.warning("skipped %d undecodable files", skipped)


def train_bpe(paths: Sequence[str], vocab_size: int) -> tokenizers.Tokenizer:
  """A byte-level BPE (GPT-2 style pre-tokenisation) trained on the files' text, BOS as id 0."""
  alphabet = tokenizers.pre_tokenizers.ByteLevel.alphabet()
  if vocab_size < len(alphabet) + 1:
    raise TokenizerError(f"--vocab_size {vocab_size} must be >= {len(alphabet) + 1} "
                         "(256 byte symbols and BOS)")
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BPE_BOS],
                                           initial_alphabet=alphabet, show_progress=False)
  tok.train_from_iterator(_texts(paths), trainer=trainer, length=len(paths))
  return tok


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m chunkformer.data.tokenizer")
  sub = parser.add_subparsers(dest="command", required=True)
  train = sub.add_parser("train", help="train a byte-level BPE tokenizer.json offline")
  train.add_argument("--input", required=True, help="glob of text files ('**' recurses)")
  train.add_argument("--vocab_size", type=int, required=True)
  train.add_argument("--output", required=True, help="tokenizer.json to write")
  train.add_argument("--overwrite", action="store_true")
  args = parser.parse_args(argv)
  logging.set_verbosity(logging.INFO)
  try:
    if os.path.exists(args.output) and not args.overwrite:
      raise TokenizerError(f"--output {args.output!r} exists; pass --overwrite to replace it")
    tok = train_bpe(expand_glob(args.input), args.vocab_size)
  except TokenizerError as e:
    sys.exit(f"error: {e}")
  tok.save(args.output)
  loaded = load(args.output)
  print(f"wrote {args.output}: vocab_size {loaded.vocab_size}, hash {loaded.hash}")


if __name__ == "__main__":
  main()
