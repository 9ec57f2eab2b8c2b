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
"""

from __future__ import annotations

import dataclasses

import numpy as np

from chunkformer import data as data_lib
from chunkformer.config import ConfigError, DataConfig
from chunkformer.data import code, code_needles, kv
from chunkformer.evaluation import needle_sweep
from chunkformer.evaluation import trained as trained_lib

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

  prefixes_K: np.ndarray  # N = 0..N_max
  rows: dict[str, np.ndarray]
  answer_row_A: np.ndarray  # per answer: its row, first and one-past-last target index
  answer_start_A: np.ndarray
  answer_stop_A: np.ndarray
  code_mask_NxT: np.ndarray | None  # code targets scored for byte accuracy (code models)
  content_start: int  # index of the first content token at N = 0 (after BOS)
  base_len: int  # tokens of a base prompt before shifting (T + 1 - N_max)

  @property
  def shape(self) -> tuple[int, int]:
    return self.rows["inputs"].shape[0] // self.prefixes_K.size, self.prefixes_K.size


def filler_token(config: DataConfig) -> int:
  return kv.FILLER_BASE if config.task == "kv" else EQUALS


def pad_token(config: DataConfig) -> int:
  return kv.PAD if config.task == "kv" else code.PAD


def base_config(config: DataConfig, spec: PrefixSpec) -> DataConfig:
  """The data config of the unshifted prompts (ConfigError naming the field if they don't fit)."""
  if spec.max_prefix < 2:
    raise ConfigError(f"config field 'sweep.prefix_max': need >= 2 prefix lengths beyond 0, got "
                      f"{spec.max_prefix}")
  if spec.num_prompts < 1:
    raise ConfigError(f"config field 'sweep.prefix_prompts': need >= 1, got {spec.num_prompts}")
  changes = {"seq_len": config.seq_len - spec.max_prefix}
  if config.task == "code" and not config.code_needles:
    changes["code_needles"] = spec.code_needles
  base = dataclasses.replace(config, **changes)
  try:
    if base.seq_len < 1:
      raise ConfigError(f"config field 'data.seq_len': {base.seq_len} tokens left")
    data_lib.check_config(base)
  except ConfigError as e:
    raise ConfigError(
        f"config field 'sweep.prefix_max': prefixes up to {spec.max_prefix} tokens leave "
        f"{base.seq_len} of data.seq_len = {config.seq_len} tokens for the prompt, too few "
        f"({e})") from None
  return base


def _base_prompt(config: DataConfig, base: DataConfig, spec: PrefixSpec, prompt: int):
  """(tokens [T'+1], answer spans [(start, stop)] in target indices, code mask [T'] or None)."""
  rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 7919, prompt]))
  if config.task == "kv":
    layout = kv.sample_layout(rng, base)
    spans = [(s.answer_start, s.answer_stop) for s in kv.query_spans(layout)]
    return kv.render_tokens(layout), spans, None
  row = code_needles.make_row(rng, base, "heldout")
  tokens = np.concatenate([row["inputs"], row["targets"][-1:]])
  answers = row["near_mask"] + row["far_mask"]
  edges = np.flatnonzero(np.diff(np.concatenate([[0.0], answers, [0.0]])))
  spans = list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))
  return tokens, spans, (row["loss_mask"] - answers) > 0


def build(config: DataConfig, spec: PrefixSpec) -> PrefixRows:
  """Every prompt at every prefix length (see module docstring)."""
  base = base_config(config, spec)
  seq_len, max_prefix = config.seq_len, spec.max_prefix
  fill, pad = filler_token(config), pad_token(config)
  tokens_rows, rows_a, starts_a, stops_a, code_rows = [], [], [], [], []
  for prompt in range(spec.num_prompts):
    tokens, spans, code_mask = _base_prompt(config, base, spec, prompt)
    for n in range(max_prefix + 1):
      row = len(tokens_rows)
      tokens_rows.append(np.concatenate([
          tokens[:1], np.full(n, fill, np.int32), tokens[1:],
          np.full(max_prefix - n, pad, np.int32)]).astype(np.int32))
      for start, stop in spans:
        rows_a.append(row)
        starts_a.append(start + n)
        stops_a.append(stop + n)
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
      prefixes_K=np.arange(max_prefix + 1), rows=rows, answer_row_A=np.array(rows_a),
      answer_start_A=np.array(starts_a), answer_stop_A=np.array(stops_a),
      code_mask_NxT=np.stack(code_rows) if code_rows else None, content_start=1,
      base_len=base.seq_len + 1)


@dataclasses.dataclass(frozen=True)
class PrefixResult:
  prefixes_K: np.ndarray
  correct_SxK: np.ndarray  # fraction of the prompt's queries answered exactly
  token_accuracy_SxK: np.ndarray  # fraction of the prompt's answer tokens right
  code_accuracy_SxK: np.ndarray | None  # byte accuracy on the code (code models)
  boundary_agreement_K: np.ndarray | None  # end flags of the content equal to those at N = 0


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
  return PrefixResult(probe.prefixes_K, exact.reshape(probe.shape), tokens.reshape(probe.shape),
                      code_accuracy, agreement)


def boundary_agreement(ends_SxKxT: np.ndarray, probe: PrefixRows) -> np.ndarray:
  """Per N: fraction of content tokens whose end flag matches the unshifted prompt's."""
  num_prompts, num_prefixes, _ = ends_SxKxT.shape
  # Content tokens 1..base_len-2 are inputs at every N (the last base token is only a target).
  length = probe.base_len - 2
  start = probe.content_start
  reference = ends_SxKxT[:, 0, start:start + length]
  agreement = np.zeros(num_prefixes)
  for n in range(num_prefixes):
    shifted = ends_SxKxT[:, n, start + n:start + n + length]
    agreement[n] = float(np.mean(shifted == reference))
  del num_prompts
  return agreement
