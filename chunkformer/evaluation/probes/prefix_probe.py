"""The prefix-padding probe (the study's '=' experiment): shift a whole prompt by N tokens.

S base prompts of ``data.seq_len - N_max`` tokens are sampled once; prompt s at prefix N is
``BOS, N filler tokens, the prompt after its BOS, N_max - N padding tokens``, so every row has
the trained length T, the content keeps its tokens and moves N positions to the right, and the
trailing padding (after every scored target) cannot influence anything under causal attention.
The filler is one repeated token: the first kv filler token for retrieval models, the byte '='
(61) for byte-level code models. The prefix goes after BOS because every training row starts
with BOS; what moves is the content's phase against fixed chunk boundaries.

Scored per prompt: the fraction of queries answered exactly (retrieval answers: kv values, or
the 4 value bytes of needles planted into held-out code) and the fraction of answer tokens
right; for code also the byte accuracy on the code itself. Accuracy vs N is analysed like a
needle sweep with offsets N = 0..N_max (``stats.analyze``: phase = N mod M). For models that
sow end flags, ``boundary_agreement[N]`` is the fraction of content tokens whose end flag equals
the one at N = 0: 1.0 everywhere means the boundaries moved with the content (shift invariant).

Code prompts (task "code", and task "corpus" on byte-level shards: the first S rows of the
held-out needle pipeline, ``corpus.pipeline`` at the shortened length) also locate each needle's
planted value, so ``needle_phases`` can tell a dependence on N mod M (the probe's phase) apart
from one on the needles' own phases (where each needle happens to sit, which varies per prompt).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from chunkformer import data as data_lib
from chunkformer.config import ConfigError, DataConfig
from chunkformer.data import builtin, code, code_needles, ingest, kv
from chunkformer.data import tokenizer as tokenizer_lib
from chunkformer.evaluation.probes import needle_sweep
from chunkformer.evaluation.probes import trained as trained_lib

FIELD = "sweep.probes.prefix_probe"  # the sweep config's entry, named by errors
EQUALS = ord("=")


@dataclasses.dataclass(frozen=True)
class PrefixSpec:
  max_prefix: int  # N_max: prefixes N = 0..N_max tokens
  num_prompts: int  # S base prompts
  code_needles: int = 4  # needles planted per code prompt when the model's data has none
  seed: int = 0


@dataclasses.dataclass(frozen=True)
class PrefixRows:
  """Rows of prompt s at prefix N are row ``s * (N_max + 1) + N``; [S*(N_max+1), T] arrays."""

  prefixes_J: np.ndarray  # N = 0..N_max
  rows: dict[str, np.ndarray]
  answer_row_A: np.ndarray  # per answer: its row, first and one-past-last target index
  answer_start_A: np.ndarray
  answer_stop_A: np.ndarray
  code_mask_NxT: np.ndarray | None  # code targets scored for byte accuracy (code models)
  content_start: int  # index of the first content token at N = 0 (after BOS)
  base_len: int  # tokens of a base prompt before shifting (T + 1 - N_max)
  # Code models: per answer, the row position (input index) of its needle's planted value's
  # first byte, after the prefix; None for kv prompts.
  value_position_A: np.ndarray | None = None

  @property
  def answer_position_A(self) -> np.ndarray:
    """Row position (input index) of each answer's first byte, after the prefix."""
    return self.answer_start_A + 1

  @property
  def shape(self) -> tuple[int, int]:
    return self.rows["inputs"].shape[0] // self.prefixes_J.size, self.prefixes_J.size


def filler_token(config: DataConfig) -> int:
  return kv.FILLER_BASE if config.task == "kv" else EQUALS


def pad_token(config: DataConfig) -> int:
  return kv.PAD if config.task == "kv" else code.PAD


def base_config(config: DataConfig, spec: PrefixSpec) -> DataConfig:
  """The data config of the unshifted prompts (ConfigError naming the field if they don't fit)."""
  if spec.max_prefix < 2:
    raise ConfigError(f"config field '{FIELD}.max_prefix': need >= 2 prefix lengths beyond 0, "
                      f"got {spec.max_prefix}")
  if spec.num_prompts < 1:
    raise ConfigError(f"config field '{FIELD}.prompts': need >= 1, got {spec.num_prompts}")
  if config.task == "corpus":
    _check_byte_level(config)
  changes = {"seq_len": config.seq_len - spec.max_prefix}
  if config.task in ("code", "corpus") and not config.code_needles:
    changes["code_needles"] = spec.code_needles
  base = dataclasses.replace(config, **changes)
  try:
    if base.seq_len < 1:
      raise ConfigError(f"config field 'data.seq_len': {base.seq_len} tokens left")
    data_lib.check_config(base)
  except ConfigError as e:
    raise ConfigError(
        f"config field '{FIELD}.max_prefix': prefixes up to {spec.max_prefix} tokens leave "
        f"{base.seq_len} of data.seq_len = {config.seq_len} tokens for the prompt, too few "
        f"({e})") from None
  return base


def _check_byte_level(config: DataConfig) -> None:
  """The probe plants '=' bytes and needle lines: a corpus must be byte-level (else ConfigError)."""
  name = config.tokenizer
  if not name:
    if builtin.is_builtin(config.path):
      return  # a built-in corpus defaults to bytes
    try:
      name = ingest.read_manifest(config.path)["tokenizer"]["name"]
    except ingest.IngestError as e:
      raise ConfigError(f"config field 'data.path': {e}") from None
  if name != tokenizer_lib.BYTES:
    raise ConfigError(
        f"config field 'data.tokenizer': the '=' prefix probe inserts '=' bytes and plants needle "
        f"bytes, so it needs a byte-level corpus (data.tokenizer = 'bytes'), got {name!r}")


@dataclasses.dataclass(frozen=True)
class _Prompt:
  tokens: np.ndarray  # [T'+1]
  spans: list[tuple[int, int]]  # answer spans (start, stop) in target indices
  code_mask: np.ndarray | None  # [T'] code targets
  value_positions: list[int] | None  # per span: token index of its planted value's first byte


def _needle_prompt(row: dict[str, np.ndarray]) -> _Prompt:
  """A planted-needle row (``code_needles.plant``) as a base prompt, its needles located."""
  tokens = np.concatenate([row["inputs"], row["targets"][-1:]])
  answers = row["near_mask"] + row["far_mask"]
  edges = np.flatnonzero(np.diff(np.concatenate([[0.0], answers, [0.0]])))
  spans = list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))
  windows = np.lib.stride_tricks.sliding_window_view(tokens, code_needles.NEEDLE_LEN)
  values = []
  for start, _ in spans:
    # Target ``start`` is the first value byte of a query line: token start + 1; its line
    # (without the QUERY token) begins PROMPT_LEN tokens earlier. The planted copy is the
    # first earlier occurrence of the whole line (keys are unique within a row).
    line_start = start + 1 - code_needles.PROMPT_LEN
    line = tokens[line_start:line_start + code_needles.NEEDLE_LEN]
    earlier = windows[:max(line_start - code_needles.NEEDLE_LEN, 0)]
    found = np.flatnonzero((earlier == line).all(axis=1))
    if not found.size:
      raise ValueError(f"needle line {bytes(line.astype(np.uint8))!r} has no planted copy")
    values.append(int(found[0]) + code_needles.PROMPT_LEN)
  return _Prompt(tokens, spans, (row["loss_mask"] - answers) > 0, values)


def _base_prompts(config: DataConfig, base: DataConfig, spec: PrefixSpec) -> list[_Prompt]:
  """The S unshifted prompts of ``base.seq_len`` (+1) tokens."""
  if config.task == "corpus":
    return _corpus_prompts(base, spec)
  prompts = []
  for prompt in range(spec.num_prompts):
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 7919, prompt]))
    if config.task == "kv":
      layout = kv.sample_layout(rng, base)
      spans = [(s.answer_start, s.answer_stop) for s in kv.query_spans(layout)]
      prompts.append(_Prompt(kv.render_tokens(layout), spans, None, None))
    else:
      prompts.append(_needle_prompt(code_needles.make_row(rng, base, "heldout")))
  return prompts


def _corpus_prompts(base: DataConfig, spec: PrefixSpec) -> list[_Prompt]:
  """The first S rows of the held-out needle pipeline (seeded by sweep.seed)."""
  from chunkformer.data import corpus, feed  # lazy: grain only for task corpus

  dataset = feed.open_for(base.path, base.tokenizer, base.heldout_fraction)
  rows = iter(corpus.pipeline(dataset, "heldout", seq_len=base.seq_len, rows=1, seed=spec.seed,
                              read_threads=base.read_threads, needles=base.code_needles,
                              near_distance=base.near_distance))
  try:
    return [_needle_prompt({k: v[0] for k, v in next(rows).items()})
            for _ in range(spec.num_prompts)]
  finally:
    if hasattr(rows, "close"):
      rows.close()


def build(config: DataConfig, spec: PrefixSpec) -> PrefixRows:
  """Every prompt at every prefix length (see module docstring)."""
  base = base_config(config, spec)
  seq_len, max_prefix = config.seq_len, spec.max_prefix
  fill, pad = filler_token(config), pad_token(config)
  tokens_rows, rows_a, starts_a, stops_a, code_rows, values_a = [], [], [], [], [], []
  for prompt in _base_prompts(config, base, spec):
    tokens, spans, code_mask = prompt.tokens, prompt.spans, prompt.code_mask
    for n in range(max_prefix + 1):
      row = len(tokens_rows)
      tokens_rows.append(np.concatenate([
          tokens[:1], np.full(n, fill, np.int32), tokens[1:],
          np.full(max_prefix - n, pad, np.int32)]).astype(np.int32))
      for start, stop in spans:
        rows_a.append(row)
        starts_a.append(start + n)
        stops_a.append(stop + n)
      if prompt.value_positions is not None:
        values_a.extend(v + n for v in prompt.value_positions)
      if code_mask is not None:
        shifted = np.zeros(seq_len, bool)
        shifted[n:n + code_mask.size] = code_mask
        code_rows.append(shifted)
  tokens_NxT1 = np.stack(tokens_rows)
  num_rows = tokens_NxT1.shape[0]
  rows = {
      "inputs": tokens_NxT1[:, :-1],
      "targets": tokens_NxT1[:, 1:],
      "positions": np.broadcast_to(np.arange(seq_len, dtype=np.int32), (num_rows, seq_len)),
      "segment_ids": np.zeros((num_rows, seq_len), np.int32),
  }
  return PrefixRows(
      prefixes_J=np.arange(max_prefix + 1), rows=rows, answer_row_A=np.array(rows_a),
      answer_start_A=np.array(starts_a), answer_stop_A=np.array(stops_a),
      code_mask_NxT=np.stack(code_rows) if code_rows else None, content_start=1,
      base_len=base.seq_len + 1,
      value_position_A=np.array(values_a) if len(values_a) == len(rows_a) else None)


@dataclasses.dataclass(frozen=True)
class PrefixResult:
  prefixes_J: np.ndarray
  correct_YxJ: np.ndarray  # fraction of the prompt's queries answered exactly
  token_accuracy_YxJ: np.ndarray  # fraction of the prompt's answer tokens right
  code_accuracy_YxJ: np.ndarray | None  # byte accuracy on the code (code models)
  boundary_agreement_J: np.ndarray | None  # end flags of the content equal to those at N = 0
  exact_A: np.ndarray | None = None  # per answer: 1.0 if every answer token is right


def run(predictor: trained_lib.Predictor, probe: PrefixRows) -> PrefixResult:
  """Scores the probe's rows; a predictor that returns ``ends`` gives boundary agreement."""
  out = predictor(probe.rows)
  predictions = out["predictions"]
  exact_a, tokens_a = needle_sweep.score_answers(
      predictions, probe.rows["targets"], probe.answer_row_A, probe.answer_start_A,
      probe.answer_stop_A)
  num_rows = predictions.shape[0]
  counts = np.bincount(probe.answer_row_A, minlength=num_rows)
  exact = np.bincount(probe.answer_row_A, exact_a, minlength=num_rows) / counts
  tokens = np.bincount(probe.answer_row_A, tokens_a, minlength=num_rows) / counts
  code_accuracy = None
  if probe.code_mask_NxT is not None:
    right = (predictions == probe.rows["targets"]) & probe.code_mask_NxT
    code_accuracy = (right.sum(axis=1) / probe.code_mask_NxT.sum(axis=1)).reshape(probe.shape)
  agreement = None
  if "ends" in out:
    agreement = boundary_agreement(out["ends"].reshape(probe.shape + (-1,)), probe)
  return PrefixResult(probe.prefixes_J, exact.reshape(probe.shape), tokens.reshape(probe.shape),
                      code_accuracy, agreement, exact_a)


def boundary_agreement(ends_YxJxT: np.ndarray, probe: PrefixRows) -> np.ndarray:
  """Per N: fraction of content tokens whose end flag matches the unshifted prompt's."""
  num_prompts, num_prefixes, _ = ends_YxJxT.shape
  # Content tokens 1..base_len-2 are inputs at every N (the last base token is only a target).
  length = probe.base_len - 2
  start = probe.content_start
  reference = ends_YxJxT[:, 0, start:start + length]
  agreement = np.zeros(num_prefixes)
  for n in range(num_prefixes):
    shifted = ends_YxJxT[:, n, start + n:start + n + length]
    agreement[n] = float(np.mean(shifted == reference))
  del num_prompts
  return agreement


def _by_group(values: np.ndarray, groups: np.ndarray, count: int) -> tuple[list, list]:
  """(mean of ``values`` per group 0..count-1 (None where empty), members per group)."""
  members = np.bincount(groups, minlength=count)
  sums = np.bincount(groups, values, minlength=count)
  means = [float(s / c) if c else None for s, c in zip(sums, members, strict=True)]
  return means, members.tolist()


def needle_phases(probe: PrefixRows, result: PrefixResult, period: int) -> dict | None:
  """Needle accuracy by N mod M, by each needle's own phase, and both at once (code prompts).

  A needle's phases at prefix N: ``answer_phase`` = position of its query's first answer byte
  mod M, ``value_phase`` = position of its planted value's first byte mod M (both in the row,
  after the prefix; the planted line's layout against the chunk grid is set by the latter).
  The unshifted value phase ``(value position - N) mod M`` differs between needles and prompts,
  so ``accuracy_by_prefix_phase_and_base_value_phase`` [N mod M][base phase] separates the two
  readings: a blind spot in absolute position shows along the diagonals (value phase fixed),
  one tied to the prefix length along the rows. Per-needle arrays are [S][N][J] (J needles per
  prompt), so any grouping can be recomputed. None for prompts without planted values (kv).
  """
  if probe.value_position_A is None or result.exact_A is None:
    return None
  num_prompts, num_prefixes = probe.shape
  per_row = np.bincount(probe.answer_row_A, minlength=num_prompts * num_prefixes)
  if not (per_row == per_row[0]).all():
    raise ValueError(f"prompts hold different numbers of needles: {sorted(set(per_row))}")
  shape = (num_prompts, num_prefixes, int(per_row[0]))
  n_a = probe.answer_row_A % num_prefixes
  answer_phase_a = probe.answer_position_A % period
  value_phase_a = probe.value_position_A % period
  base_phase_a = (probe.value_position_A - n_a) % period
  correct_a = result.exact_A.astype(np.float64)
  by_prefix, prefix_counts = _by_group(correct_a, n_a % period, period)
  by_answer, answer_counts = _by_group(correct_a, answer_phase_a, period)
  by_value, value_counts = _by_group(correct_a, value_phase_a, period)
  both, both_counts = _by_group(correct_a, (n_a % period) * period + base_phase_a, period**2)
  code_by_prefix = None
  if result.code_accuracy_YxJ is not None:
    phase_k = probe.prefixes_J % period
    code_by_prefix = [float(result.code_accuracy_YxJ[:, phase_k == p].mean())
                      if (phase_k == p).any() else None for p in range(period)]
  return {
      "period": period,
      "accuracy_by_prefix_phase": by_prefix, "count_by_prefix_phase": prefix_counts,
      "accuracy_by_answer_phase": by_answer, "count_by_answer_phase": answer_counts,
      "accuracy_by_value_phase": by_value, "count_by_value_phase": value_counts,
      "accuracy_by_prefix_phase_and_base_value_phase": [
          both[i * period:(i + 1) * period] for i in range(period)],
      "count_by_prefix_phase_and_base_value_phase": [
          both_counts[i * period:(i + 1) * period] for i in range(period)],
      "code_accuracy_by_prefix_phase": code_by_prefix,
      "correct_YxNxJ": correct_a.astype(int).reshape(shape).tolist(),
      "answer_phase_YxNxJ": answer_phase_a.reshape(shape).tolist(),
      "value_phase_YxNxJ": value_phase_a.reshape(shape).tolist(),
  }
