"""A tiny byte-level BPE over a known word list, built by hand for the word vocabulary tests.

Every byte is a token (the GPT-2 byte alphabet, as Qwen3's and our trained BPEs), BOS is id 0,
and merges build each listed word right to left ("a t" -> "at", "c at" -> "cat", "Ġ cat" ->
"Ġcat") so that " cat" encodes to the single token "Ġcat" and the only space-prefixed pieces
are the whole words. Decoys that must not be chosen: "Ġzebra" (in the vocabulary but no merge
makes it, so " zebra" does not encode back to it), "Ġ42" (not letters), "Ġx" (one letter) and
the unprefixed intermediates ("cat").
"""

from __future__ import annotations

import tokenizers

WORDS = ("cat", "dog", "owl", "elk", "bee", "cow", "fox", "yak", "hen", "ram", "emu", "gnu",
         "Ann", "Bob", "Cy", "Dee", "Eve", "Fay", "Gus", "Hal", "Ida", "Jo", "Kim", "Lu")
BOS = "<|bos|>"


def build(words=WORDS) -> tokenizers.Tokenizer:
  alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
  vocab = {BOS: 0}
  for ch in alphabet:
    vocab[ch] = len(vocab)
  merges = []

  def merge(a, b):
    if a + b not in vocab:
      vocab[a + b] = len(vocab)
      merges.append((a, b))

  for piece in [w for w in words] + ["42"]:
    tail = piece[-1]
    for ch in reversed(piece[:-1]):
      merge(ch, tail)
      tail = ch + tail
    merge("Ġ", tail)
  merge("Ġ", "x")
  vocab["Ġzebra"] = len(vocab)
  tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=merges))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  tok.add_special_tokens([tokenizers.AddedToken(BOS, special=True)])
  return tok


def save(path: str, words=WORDS) -> str:
  build(words).save(path)
  return path
