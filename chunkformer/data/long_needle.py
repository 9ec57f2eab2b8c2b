"""The long needle test: a context full of multi-token records, the target key near the middle.

A prompt of T tokens (``seq_len``, any length a model supports)::

  [BOS]  P filler  record record ... record  filler  key_1..key_a value_1..value_{b-1}
                   (key_len + value_len tokens each, back to back)  ^ query, fixed position

Records are ``key_len`` key tokens followed by ``value_len`` value tokens, packed back to back
from the first token after the P < record_len filler tokens up to the query block. The query
block repeats the target's key and then its value tokens (teacher forced): the predictions at
the positions of the last key token and the first value_len - 1 value tokens are scored, all
right = retrieved. Every query token sits at the same position in every prompt.

The target key's first token position t_K is drawn per residue r = t_K mod ``modulus`` (a
multiple of the stride, 8 for the DeepSeek models) from ``matched_positions`` inside a window
of +-``spread`` tokens around the middle of the record area: the same mean and variance of t_K
in every group, ``prompts_per_residue`` prompts each. P = (t_K - first) mod record_len puts a
record boundary at t_K. No other record has the target's key.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from chunkformer.data import matched_positions
from chunkformer.data.lookup_task import Prompts


@dataclasses.dataclass(frozen=True)
class NeedleSpec:
  seq_len: int
  keys: tuple[int, ...]  # key token ids (a key is key_len of them)
  values: tuple[int, ...]  # value token ids
  filler: int
  bos: int | None = None
  key_len: int = 2
  value_len: int = 2
  modulus: int = 8
  prompts_per_residue: int = 64
  spread: int = 0  # half-width of the t_K window around the middle; 0: two periods

  @property
  def record_len(self) -> int:
    return self.key_len + self.value_len

  @property
  def start(self) -> int:
    return 0 if self.bos is None else 1

  @property
  def query_start(self) -> int:
    """Position of the query's first key token (one filler token before it)."""
    return self.seq_len - (self.key_len + self.value_len - 1)

  @property
  def half_width(self) -> int:
    return self.spread or 2 * self.modulus

  def window(self) -> tuple[int, int]:
    """[lo, hi] of t_K: around the middle of the record area, whole records fit on both sides."""
    middle = (self.start + self.query_start - 1) // 2
    return middle - self.half_width, middle + self.half_width

  def validate(self, prefix: str = "") -> None:
    def bad(field, why):
      raise ValueError(f"{prefix}{field}: {why}")
    if self.key_len < 1 or self.value_len < 1:
      bad("key_len", "keys and values need >= 1 token each")
    if len(set(self.keys)) < 2 or not self.values:
      bad("keys", "need >= 2 key tokens and >= 1 value token")
    special = {self.filler} | ({self.bos} if self.bos is not None else set())
    if special & (set(self.keys) | set(self.values)):
      bad("keys", "key and value tokens must differ from the filler and BOS tokens")
    if 2 * self.half_width + 1 < 3 * self.modulus:
      bad("spread", f"a window of {2 * self.half_width + 1} tokens spans fewer than 3 periods "
                    f"of {self.modulus}")
    lo, hi = self.window()
    # the record holding t_K must start after the largest prefix and end before the query
    if lo - self.record_len < self.start or hi + self.record_len > self.query_start - 1:
      bad("seq_len", f"{self.seq_len} tokens leave no room for a t_K window of +-"
                     f"{self.half_width} around the middle with whole records on both sides")
    matched_positions.check_group_size(self.modulus, self.prompts_per_residue,
                                       f"{prefix}prompts_per_residue")


def generate(spec: NeedleSpec, seed: int) -> Prompts:
  """``prompts_per_residue`` prompts per residue of ``spec.modulus``, in residue order."""
  spec.validate()
  rng = np.random.default_rng(seed)
  lo, hi = spec.window()
  targets = matched_positions.matched_positions(spec.modulus, spec.prompts_per_residue, lo,
                                                hi).reshape(-1)
  t, a, b, size = spec.seq_len, spec.key_len, spec.value_len, spec.record_len
  keys, values = np.asarray(spec.keys), np.asarray(spec.values)
  n = targets.size
  tokens = np.full((n, t), spec.filler, np.int32)
  if spec.bos is not None:
    tokens[:, 0] = spec.bos
  answers = np.empty((n, b), np.int32)
  qs = spec.query_start
  for p, t_k in enumerate(targets):
    first = spec.start + (int(t_k) - spec.start) % size
    count = (qs - 1 - first) // size
    key_RxA = rng.choice(keys, (count, a))
    value_RxB = rng.choice(values, (count, b))
    j = (int(t_k) - first) // size
    same = np.all(key_RxA == key_RxA[j], axis=1)
    same[j] = False
    while same.any():  # redraw distractors that repeat the target's key
      key_RxA[same] = rng.choice(keys, (int(same.sum()), a))
      same = np.all(key_RxA == key_RxA[j], axis=1)
      same[j] = False
    tokens[p, first:first + count * size] = np.concatenate([key_RxA, value_RxB], 1).reshape(-1)
    tokens[p, qs:qs + a] = key_RxA[j]
    tokens[p, qs + a:] = value_RxB[j, :b - 1]
    answers[p] = value_RxB[j]
  answer_positions = tuple(range(qs + a - 1, qs + a - 1 + b))
  return Prompts(tokens, answer_positions, answers, targets.astype(np.int64),
                 targets % spec.modulus, spec.modulus)
