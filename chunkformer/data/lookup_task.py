"""The position-matched lookup task: records, demonstrations, a target key; answer its value.

A prompt of T tokens (``seq_len``; it is the model's input row, nothing follows it)::

  [BOS]  record region  filler  demonstrations  target key
         k v k v ...     one    k v k v (D)     at T - 1 (the query position, the same always)

R records (``num_records``) each a single-token key directly followed by a single-token value
(keys distinct within a prompt), laid out in the record region with ``F`` filler tokens around
them; then D demonstrations (``num_demos``): D other records repeated in the same format, then
the target key. The answer is the token after the target's key in the records: the model's
greedy prediction at T - 1 is scored against it over the full vocabulary.

The target key's position t_K is drawn per residue group r = t_K mod ``modulus`` from
``matched_positions`` (every group: the same mean and variance of t_K, ``prompts_per_residue``
prompts). Padding modes place the records around it:
- ``prefix``: the records are one contiguous block after P filler tokens; P shifts all of them
  together, so every distractor key sits at a fixed distance from the target (its phase moves
  in lockstep with the target's);
- ``in_sequence``: the F filler tokens are split into R + 1 random gaps (before, between and
  after the records) with the gaps before the target summing to what t_K needs; distractor
  phases then vary more independently of the target's (``lockstep`` measures it), but not
  fully: the filler left after the target depends on t_K, so the next record's phase still
  goes with the target's (``neighbour_coupling``: Cramer's V about 0.24 at the paper
  protocol's size);
- ``in_sequence_decorrelated`` (not in ``PADDINGS``, so no committed sweep's default changes):
  as ``in_sequence``, but the gaps next to the target record (before it and after it) are
  drawn uniformly from 0 .. modulus - 1 first and the rest of the filler split around them,
  and the target's record index is drawn among those that leave that room on each side
  with a neighbour; every
  neighbour's distance to the target is then uniform modulo the modulus, so neighbour phases
  are independent of the target's wherever the room exists (near the ends of the position
  range it does not, and the coupling left is measured).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from chunkformer.data import matched_positions

PADDINGS = ("prefix", "in_sequence")
DECORRELATED = "in_sequence_decorrelated"
ALL_PADDINGS = (*PADDINGS, DECORRELATED)
POSITION_DESIGNS = ("moments", "shift")


@dataclasses.dataclass(frozen=True)
class Prompts:
  """Prompts of one test, in residue order (all of residue 0, then 1, ...)."""

  tokens: np.ndarray  # int32 [N, T]: the model's input rows
  answer_positions: tuple[int, ...]  # input positions whose predictions are scored (fixed)
  answers: np.ndarray  # int32 [N, len(answer_positions)]: the right next tokens there
  target_positions: np.ndarray  # int64 [N]: t_K, the target key's (first token's) position
  residues: np.ndarray  # int64 [N]: t_K mod modulus
  modulus: int
  record_positions: np.ndarray | None = None  # int64 [N, R]: every record key's position

  def rows(self) -> dict[str, np.ndarray]:
    """The predictor's rows: one document per row, positions 0..T-1."""
    n, t = self.tokens.shape
    return {"inputs": self.tokens,
            "positions": np.broadcast_to(np.arange(t, dtype=np.int32), (n, t)).copy(),
            "segment_ids": np.zeros((n, t), np.int32)}

  def correct(self, predictions_NxT: np.ndarray) -> np.ndarray:
    """bool [N]: every scored position predicted right."""
    picked = np.asarray(predictions_NxT)[:, list(self.answer_positions)]
    return np.all(picked == self.answers, axis=1)


@dataclasses.dataclass(frozen=True)
class LookupSpec:
  seq_len: int
  keys: tuple[int, ...]  # single-token key ids
  values: tuple[int, ...]  # single-token value ids
  filler: int
  bos: int | None = None  # first token of every prompt, if any
  num_records: int = 64
  num_demos: int = 8
  modulus: int = 24
  prompts_per_residue: int = 576
  padding: str = "prefix"
  # "moments": every residue's target positions with equal mean and variance
  # (matched_positions.matched_positions, what the committed sweeps used); "shift": one
  # multiset of positions shifted by the residue (matched_positions.shifted_positions)
  positions: str = "moments"
  # False: each record's value drawn from ``values`` with replacement (the committed sweeps);
  # True: the records' values distinct within a prompt, so no value is more frequent than
  # another and a strategy that never reads the target's record is worth 1 / candidates
  # (``lookup_shortcuts``)
  distinct_values: bool = False
  # Filler tokens drawn uniformly per filler position from filler .. filler + filler_kinds - 1
  # (1: the one repeated token of the committed sweeps), as the kv rows draw theirs
  filler_kinds: int = 1
  # A token written before each demonstration and before the target key (None: the committed
  # layout, demonstrations packed after one filler), as the kv rows mark each query
  query: int | None = None

  @property
  def fillers(self) -> range:
    """The filler tokens: ``filler`` and the ``filler_kinds - 1`` after it."""
    return range(self.filler, self.filler + self.filler_kinds)

  @property
  def demo_stride(self) -> int:
    """Tokens per demonstration: key and value, after the query token if there is one."""
    return 2 if self.query is None else 3

  @property
  def demo_key_positions(self) -> np.ndarray:
    """Positions of the D demonstrations' keys (the value follows each)."""
    first = self.region_end + 1 + (self.query is not None)
    return first + self.demo_stride * np.arange(self.num_demos)

  def blank(self, rng: np.random.Generator, shape) -> np.ndarray:
    """int32 rows of ``shape`` (..., T) holding filler (and BOS), ready for ``place``."""
    tokens = np.full(shape, self.filler, np.int32)
    if self.filler_kinds > 1:
      tokens += rng.integers(self.filler_kinds, size=shape, dtype=np.int32)
    if self.bos is not None:
      tokens[..., 0] = self.bos
    return tokens

  @property
  def start(self) -> int:
    return 0 if self.bos is None else 1

  @property
  def region_end(self) -> int:
    """End (exclusive) of the record region: a filler token, then the demonstrations."""
    return self.seq_len - 2 - self.demo_stride * self.num_demos - (self.query is not None)

  @property
  def free_filler(self) -> int:
    """F: filler tokens of the record region around the records."""
    return self.region_end - self.start - 2 * self.num_records

  def validate(self, prefix: str = "") -> None:
    """ValueError naming the field for a spec that cannot produce its prompts."""
    def bad(field, why):
      raise ValueError(f"{prefix}{field}: {why}")
    if self.padding not in ALL_PADDINGS:
      bad("padding", f"{self.padding!r} is not one of {', '.join(ALL_PADDINGS)}")
    if self.num_records < 1 or self.num_demos < 0:
      bad("num_records", "need >= 1 record and >= 0 demonstrations")
    if self.num_demos >= self.num_records:
      bad("num_demos", f"{self.num_demos} demonstrations need more than that many records "
                       f"(num_records = {self.num_records}): the target is never demonstrated")
    if len(set(self.keys)) < self.num_records:
      bad("keys", f"{len(set(self.keys))} distinct key tokens for {self.num_records} records")
    if not self.values:
      bad("values", "no value tokens")
    if self.distinct_values and len(set(self.values)) < self.num_records:
      bad("values", f"{len(set(self.values))} distinct value tokens cannot give "
                    f"{self.num_records} records distinct values (distinct_values)")
    if self.filler_kinds < 1:
      bad("filler_kinds", f"must be >= 1, got {self.filler_kinds}")
    special = set(self.fillers) | {t for t in (self.bos, self.query) if t is not None}
    if self.query is not None and self.query in self.fillers:
      bad("query", f"token {self.query} is one of the filler tokens")
    if special & (set(self.keys) | set(self.values)) or set(self.keys) & set(self.values):
      bad("keys", "key, value, filler, query and BOS tokens must be disjoint")
    span = self.free_filler + 2 * self.num_records - 1  # t_K range: start .. start + span - 1
    if self.free_filler < 0 or span < 3 * self.modulus:
      bad("seq_len", f"{self.seq_len} tokens leave target positions over {max(span, 0)} tokens "
                     f"for {self.num_records} records and {self.num_demos} demonstrations; "
                     f"matching needs >= {3 * self.modulus} (3 periods of the modulus)")
    if self.positions not in POSITION_DESIGNS:
      bad("positions", f"{self.positions!r} is not one of {', '.join(POSITION_DESIGNS)}")
    if self.positions == "moments":
      matched_positions.check_group_size(self.modulus, self.prompts_per_residue,
                                         f"{prefix}prompts_per_residue")


def _composition(rng: np.random.Generator, total: int, parts: int) -> np.ndarray:
  """A uniformly random split of ``total`` into ``parts`` non-negative integers."""
  if parts == 1:
    return np.array([total])
  cuts = np.sort(rng.choice(total + parts - 1, parts - 1, replace=False))
  edges = np.concatenate([[-1], cuts, [total + parts - 1]])
  return np.diff(edges) - 1


def _record_offsets(rng: np.random.Generator, spec: LookupSpec, t_k: int, j: int) -> np.ndarray:
  """Key positions of all R records given the target's position t_K and index j."""
  r, f = spec.num_records, spec.free_filler
  before = t_k - spec.start - 2 * j  # filler tokens before the target record
  if spec.padding == "prefix":
    gaps = np.zeros(r, np.int64)
    gaps[0] = before
  elif spec.padding == DECORRELATED:
    after = f - before
    g_before = int(rng.integers(0, min(spec.modulus - 1, before) + 1)) if j else before
    head = (np.append(_composition(rng, before - g_before, j), g_before) if j
            else np.array([before]))
    if j < r - 1:
      g_after = int(rng.integers(0, min(spec.modulus - 1, after) + 1))
      tail = np.concatenate([[g_after], _composition(rng, after - g_after, r - j - 1)])
    else:
      tail = np.array([after])
    gaps = np.concatenate([head, tail])[:r]
  else:
    gaps = np.concatenate([_composition(rng, before, j + 1),
                           _composition(rng, f - before, r - j)])[:r]
  return spec.start + np.cumsum(gaps) + 2 * np.arange(r)


def generate(spec: LookupSpec, seed: int) -> Prompts:
  """``prompts_per_residue`` prompts per residue of ``spec.modulus`` (see module docstring)."""
  spec.validate()
  rng = np.random.default_rng(seed)
  t, r_count, f = spec.seq_len, spec.num_records, spec.free_filler
  design = (matched_positions.matched_positions if spec.positions == "moments"
            else matched_positions.shifted_positions)
  positions_MxN = design(spec.modulus, spec.prompts_per_residue, spec.start,
                         spec.start + f + 2 * r_count - 2)
  targets = positions_MxN.reshape(-1)
  n = targets.size
  tokens = spec.blank(rng, (n, t))
  answers = np.empty((n, 1), np.int32)
  record_positions = np.empty((n, r_count), np.int64)
  for p, t_k in enumerate(targets):
    answers[p, 0], record_positions[p] = place(rng, spec, int(t_k), tokens[p])
  return Prompts(tokens, (t - 1,), answers, targets.astype(np.int64),
                 targets % spec.modulus, spec.modulus, record_positions)


def place(rng: np.random.Generator, spec: LookupSpec, t_k: int,
          row: np.ndarray) -> tuple[int, np.ndarray]:
  """Writes one prompt's records, demonstrations and target key into ``row`` (T tokens, filler
  and BOS already in place) with the target key at ``t_k``; returns the answer and the R record
  key positions. The target's record index j is drawn among those ``t_k`` allows."""
  r_count, f = spec.num_records, spec.free_filler
  j_lo = max(0, -(-(t_k - spec.start - f) // 2))
  j_hi = min(r_count - 1, (t_k - spec.start) // 2)
  if spec.padding == DECORRELATED:
    # Prefer an index that leaves a full modulus of filler on each side of the target that
    # has a neighbour (the first record has none before it, the last none after it).
    js = np.arange(j_lo, j_hi + 1)
    before = t_k - spec.start - 2 * js
    roomy = js[((js == 0) | (before >= spec.modulus - 1))
               & ((js == r_count - 1) | (f - before >= spec.modulus - 1))]
    j = int(rng.choice(roomy if roomy.size else js))
  else:
    j = int(rng.integers(j_lo, j_hi + 1))
  at = _record_offsets(rng, spec, t_k, j)
  k = rng.choice(np.asarray(spec.keys), r_count, replace=False)
  v = rng.choice(np.asarray(spec.values), r_count, replace=not spec.distinct_values)
  row[at], row[at + 1] = k, v
  demos = rng.choice(np.delete(np.arange(r_count), j), spec.num_demos, replace=False)
  demo_keys = spec.demo_key_positions
  row[demo_keys], row[demo_keys + 1] = k[demos], v[demos]
  if spec.query is not None:
    row[demo_keys - 1] = spec.query
    row[spec.seq_len - 2] = spec.query
  row[spec.seq_len - 1] = k[j]
  return int(v[j]), at


def phase_locking(target_positions: np.ndarray, other_positions: np.ndarray,
                  modulus: int) -> float:
  """|mean exp(2 pi i (t_other - t_K) / M)| over prompts: 1 when the other position's phase
  moves in lockstep with the target's (a constant phase difference), near 0 when the
  difference is spread evenly over the M phases."""
  diff = (np.asarray(other_positions) - np.asarray(target_positions)) % modulus
  return float(np.abs(np.mean(np.exp(2j * np.pi * diff / modulus))))


def lockstep(prompts: Prompts) -> float:
  """How much distractor phases move with the target's: for each distance d != 0 in record
  index from the target, ``phase_locking`` of the records d after it, averaged over d weighted
  by how many records have that distance. 1 for prefix padding (each distractor at a fixed
  distance from the target); near 0 when in-sequence gaps spread the phases out."""
  rec = prompts.record_positions
  n, r = rec.shape
  j = np.argmax(rec == prompts.target_positions[:, None], axis=1)
  d_NxR = np.arange(r)[None, :] - j[:, None]
  total = weight = 0.0
  for d in range(-(r - 1), r):
    rows, cols = np.nonzero(d_NxR == d)
    if d == 0 or rows.size == 0:
      continue
    total += rows.size * phase_locking(prompts.target_positions[rows], rec[rows, cols],
                                       prompts.modulus)
    weight += rows.size
  return total / weight


def default_tokens(data) -> dict[str, object]:
  """keys, values, filler, bos in a model's own task vocabulary (``data``: its DataConfig):
  the kv task's symbols split into keys and values, or letters and digits of the byte-level
  code task. Other tasks have none: the caller gives them."""
  if data.task in ("kv", "lookup"):  # lookup rows use the kv vocabulary (data/lookup_rows.py)
    from chunkformer.data import kv

    base, half = kv.symbol_base(data), data.num_symbols // 2
    return {"keys": tuple(range(base, base + half)),
            "values": tuple(range(base + half, base + data.num_symbols)),
            "filler": kv.FILLER_BASE, "bos": kv.BOS}
  if data.task == "code":
    from chunkformer.data import code

    return {"keys": tuple(range(ord("A"), ord("Z") + 1)) + tuple(range(ord("0"), ord("9") + 1)),
            "values": tuple(range(ord("a"), ord("z") + 1)),
            "filler": ord(" "), "bos": code.BOS}
  raise ValueError(f"task {data.task!r} has no default lookup tokens; give keys, values and "
                   f"filler")


def neighbour_coupling(prompts: Prompts, stride: int, step: int = 1) -> float:
  """Cramer's V between the target's phase t_K mod ``stride`` and the phase of the record
  ``step`` records after it (-1: before it), over the prompts that have one: 0 when the
  neighbour's phase says nothing about the target's, 1 in lockstep (prefix padding)."""
  from scipy.stats import contingency

  rec, t = prompts.record_positions, prompts.target_positions
  j = np.argmax(rec == t[:, None], axis=1)
  has = (j + step >= 0) & (j + step < rec.shape[1])
  nxt = rec[np.flatnonzero(has), j[has] + step]
  table = contingency.crosstab(t[has] % stride, nxt % stride).count
  return float(contingency.association(table, method="cramer"))
