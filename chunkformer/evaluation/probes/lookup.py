"""The ``lookup`` and ``long_needle`` entries of ``PROBES``: the position-matched tests.

``lookup``: the single-token lookup task (``chunkformer/data/lookup_task.py``) in each padding
mode; ``long_needle``: multi-token records filling the context (``data/long_needle.py``). Both
score the greedy full-vocabulary prediction at the fixed query position and report accuracy by
residue of the target key's position (``residue_accuracy``), the validation loss the run
recorded, and the outcome matrices (``<probe>_<mode>``: prompts x residue).

Tokens come from one of two vocabularies (option ``vocabulary``):
- ``task`` (default): the model's own task vocabulary (kv symbols split into keys and values,
  or letters of the byte-level code task); a loaded model with a tokenizer gets kv rows through
  its token map (``context.predict`` maps them). Other tasks must name ``keys``, ``values`` and
  ``filler``.
- ``words``: single-token words of the model's tokenizer (``chunkformer/data/word_tokens.py``;
  an imported checkpoint's tokenizer.json or a corpus model's), disjoint keys and values drawn
  by ``word_seed`` (``num_keys``/``num_values``, 0: all words found, split in halves), its
  filler and BOS; rows are in the model's ids and go in unmapped.
Given ``keys``, ``values``, ``filler`` or ``bos`` replace the vocabulary's (with ``words``,
keys and values may be given as words, e.g. the paper's animals and names, each one token).
Rows are the model's ``data.seq_len`` tokens long.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chunkformer import run_tokens
from chunkformer import workdir as workdir_lib
from chunkformer.config import ConfigError
from chunkformer.data import (
  long_needle,
  lookup_shortcuts,
  lookup_task,
  matched_positions,
  word_tokens,
)
from chunkformer.evaluation import stats
from chunkformer.evaluation.probes import loaded_model, needle_sweep
from chunkformer.evaluation.probes.base import Primary, ProbeContext, ProbeResult
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.residue_test import ResidueTest
from chunkformer.evaluation.stats import residue_accuracy

DEFAULT = "default"  # BOS option: the vocabulary's own BOS token
TASK, WORDS = "task", "words"  # the ``vocabulary`` option (module docstring)
VOCABULARIES = (TASK, WORDS)


def validation_loss(workdir: str) -> float | None:
  """The held-out loss the run wrote at its last step (``final_metrics.json``), if any."""
  loss = ((workdir_lib.read_final_metrics(workdir) or {}).get("heldout") or {}).get("loss")
  return None if loss is None else float(loss)


def check_vocabulary(field: str, vocabulary: str = TASK, word_seed: int = 0,
                     num_keys: int = 0, num_values: int = 0, **_) -> None:
  """ConfigError naming ``field`` (``sweep.probes.<name>``) and the option for vocabulary
  options that cannot work; needs no model (the registry runs it before training)."""
  if vocabulary not in VOCABULARIES:
    raise ConfigError(f"config field '{field}': vocabulary: {vocabulary!r} is not one of "
                      f"{', '.join(VOCABULARIES)}")
  for option, value in (("num_keys", num_keys), ("num_values", num_values)):
    if not isinstance(value, int) or value < 0:
      raise ConfigError(f"config field '{field}': {option}: {value!r} is not a count >= 0")
  if vocabulary == TASK and (word_seed or num_keys or num_values):
    raise ConfigError(f"config field '{field}': word_seed, num_keys and num_values choose "
                      f"words; set vocabulary = {WORDS!r} too")


def check_prompt_count(field: str, modulus: int, prompts_per_residue: int,
                       positions: str = lookup_task.POSITION_DESIGNS[0]) -> None:
  """ConfigError naming ``field`` when ``prompts_per_residue`` (0: the smallest that works)
  cannot match the residue groups' positions in mean and variance (the "moments" design;
  the shifted design takes any count); needs no model."""
  if prompts_per_residue and positions == lookup_task.POSITION_DESIGNS[0]:
    try:
      matched_positions.check_group_size(modulus, prompts_per_residue, "prompts_per_residue")
    except ValueError as e:
      raise ConfigError(f"config field '{field}': {e}") from None


def check_options(field: str, probe, **given) -> None:
  """The checks a sweep config's options for the position-matched probe ``probe`` (lookup,
  long_needle, head_knockout, ...) get before anything trains: the vocabulary options, and
  the prompt count against the probe's modulus where the probe takes one (its default when
  not given)."""
  check_vocabulary(field, **given)
  defaults = inspect.signature(probe).parameters
  if "modulus" not in defaults or "prompts_per_residue" not in defaults:
    return
  def value(name, fallback=None):
    if given.get(name) is not None:
      return given[name]
    return defaults[name].default if name in defaults else fallback
  check_prompt_count(field, value("modulus"), value("prompts_per_residue"),
                     value("positions") or lookup_task.POSITION_DESIGNS[0])


def _words(context: ProbeContext, given: dict[str, Any], word_seed: int, num_keys: int,
           num_values: int) -> dict[str, Any]:
  """keys, values, filler, bos in the model's own words: ``given`` keys or values as words
  (strings) or ids, the rest drawn from its tokenizer's single-token words."""
  trained = context.trained
  tokenizer = run_tokens.model_tokenizer(trained.workdir, trained.config)
  if tokenizer is None:
    raise ValueError(f"vocabulary: 'words' needs a model that speaks a tokenizer (an imported "
                     f"checkpoint with tokenizer.json, or a corpus model); the run in "
                     f"{trained.workdir!r} (task {trained.config.data.task!r}) has none")
  vocab = trained.config.model.vocab_size
  lists = {k: word_tokens.word_ids(tokenizer, given[k], vocab, k)
           for k in ("keys", "values") if given[k] is not None}
  if len(lists) == 2:
    filler, bos = word_tokens.filler_and_bos(tokenizer, vocab)
    return {**lists, "filler": filler, "bos": bos}
  taken = [i for ids in lists.values() for i in ids]
  drawn = word_tokens.choose(tokenizer, vocab, seed=word_seed, num_keys=num_keys,
                             num_values=num_values, exclude=taken,
                             draw=tuple(k for k in ("keys", "values") if k not in lists))
  return {**drawn.as_dict(), **lists}


def _tokens(context: ProbeContext, name: str, keys, values, filler, bos,
            vocabulary: str = TASK, word_seed: int = 0, num_keys: int = 0,
            num_values: int = 0) -> dict[str, Any]:
  """keys, values, filler, bos: the options given, the vocabulary's for the rest; a
  ConfigError naming ``sweep.probes.<name>`` and the option otherwise."""
  field = f"sweep.probes.{name}"
  check_vocabulary(field, vocabulary, word_seed, num_keys, num_values)
  given = {"keys": keys, "values": values, "filler": filler}
  try:
    if vocabulary == WORDS:
      out = _words(context, given, word_seed, num_keys, num_values)
    else:
      for k in ("keys", "values"):
        if given[k] is not None and any(isinstance(i, str) for i in given[k]):
          raise ValueError(f"{k}: words ({given[k][:3]}...) need vocabulary = {WORDS!r}")
      if all(v is not None for v in given.values()):
        out = {"bos": None if bos in (None, DEFAULT) else int(bos)}
      else:
        out = lookup_task.default_tokens(context.trained.config.data)
  except (ValueError, ConfigError) as e:
    raise ConfigError(f"config field '{field}': {e}") from None
  for k, v in given.items():
    if v is not None and not (vocabulary == WORDS and k != "filler"):
      out[k] = tuple(int(i) for i in v) if k != "filler" else int(v)
  if bos != DEFAULT:
    out["bos"] = None if bos is None else int(bos)
  return out


def predictor(context: ProbeContext, vocabulary: str):
  """The context's predictor for rows of ``vocabulary``: words are the model's own ids, so a
  loaded model's token map is bypassed."""
  return context.predict if vocabulary == TASK else loaded_model.unmapped(context.predict)


def _stride(context: ProbeContext, stride: int) -> int | None:
  return stride or (context.chunk_sizes[0] if context.chunk_sizes else None)


def _per_residue(modulus: int, prompts_per_residue: int) -> int:
  return prompts_per_residue or matched_positions.smallest_group(modulus)


def _score(predict, prompts: lookup_task.Prompts, stride: int | None):
  """The residue summary and the matrix: outcomes, the target positions, and for a model that
  forms its own chunks (its predictor returns ``ends``) the target key's phase inside the
  chunk it landed in."""
  out = predict(prompts.rows())
  outcomes = prompts.correct(out["predictions"])
  summary = residue_accuracy.summarize(outcomes, prompts.residues, prompts.modulus, stride)

  def by_residue(values_N):
    return residue_accuracy.by_residue(values_N, prompts.residues, prompts.modulus)

  phases = None
  if "ends" in out:
    phases = by_residue(needle_sweep.chunk_phases(np.asarray(out["ends"]),
                                                  prompts.target_positions))
    chunks = formed_chunks(np.asarray(out["ends"]), prompts.target_positions)
  matrix = correctness.Matrix(by_residue(outcomes).astype(np.float64), np.arange(prompts.modulus),
                              phases_YxJ=phases, positions_YxJ=by_residue(prompts.target_positions))
  return summary, matrix, (chunks if "ends" in out else None)


def formed_chunks(ends_NxT: np.ndarray, targets_N: np.ndarray) -> dict[str, float]:
  """What a model that forms its own chunks formed on the prompts: tokens per closed chunk
  (``compression_ratio``), the mean length of the chunk holding the target key (its end
  included: up to the first end flag at or after it, or the row's end) and the target's mean
  phase inside it."""
  ends = np.asarray(ends_NxT, bool)
  n, t = ends.shape
  lengths, phases = [], []
  for row, target in zip(ends, np.asarray(targets_N), strict=True):
    before = np.flatnonzero(row[:target])
    start = before[-1] + 1 if before.size else 0
    after = np.flatnonzero(row[target:])
    stop = target + after[0] + 1 if after.size else t
    lengths.append(stop - start)
    phases.append(target - start)
  closed = ends.sum(axis=1).mean()
  return {"compression_ratio": float(t / closed) if closed else None,
          "target_chunk_length": float(np.mean(lengths)),
          "target_phase": float(np.mean(phases))}


def _vocabulary_settings(spec, vocabulary: str, word_seed: int, num_keys: int,
                         num_values: int) -> dict[str, Any]:
  """The record's account of a words vocabulary (the task's adds nothing): the seed and the
  counts drawn, the filler and BOS ids."""
  if vocabulary == TASK:
    return {}
  return {"vocabulary": WORDS, "word_seed": word_seed, "num_keys": len(spec.keys),
          "num_values": len(spec.values), "filler": spec.filler, "bos": spec.bos}


def _checked(spec, name: str):
  """``spec``, or a ConfigError naming the probe's entry and the field (before any forward
  pass)."""
  try:
    spec.validate()
  except ValueError as e:
    raise ConfigError(f"config field 'sweep.probes.{name}': {e}") from None
  return spec


def lookup_spec(context: ProbeContext, name: str, *, modulus: int, prompts_per_residue: int,
                num_records: int, num_demos: int, padding: str, keys, values, filler,
                bos, vocabulary: str = TASK, word_seed: int = 0, num_keys: int = 0,
                num_values: int = 0, positions: str = "moments",
                distinct_values: bool = False) -> lookup_task.LookupSpec:
  """The lookup task of probe ``name`` on the context's model (defaults as in ``probe``),
  checked: a ConfigError naming ``sweep.probes.<name>`` and the field otherwise."""
  tokens = _tokens(context, name, keys, values, filler, bos, vocabulary, word_seed, num_keys,
                   num_values)
  spec = lookup_task.LookupSpec(seq_len=context.trained.config.data.seq_len, modulus=modulus,
                                num_demos=num_demos, padding=padding, positions=positions,
                                distinct_values=distinct_values,
                                prompts_per_residue=_per_residue(modulus, prompts_per_residue),
                                **tokens)
  if not num_records:
    room = (spec.region_end - spec.start) // 4
    num_records = max(1, min(64, len(set(tokens["keys"])), room))
    num_demos = min(num_demos, num_records - 1)
  return _checked(dataclasses.replace(spec, num_records=num_records, num_demos=num_demos), name)


def probe(context: ProbeContext, modulus: int = 24, prompts_per_residue: int = 0,
          num_records: int = 0, num_demos: int = 8,
          paddings: Sequence[str] = lookup_task.PADDINGS, seed: int = 2609, stride: int = 0,
          keys: Sequence[int] | None = None, values: Sequence[int] | None = None,
          filler: int | None = None, bos: int | str | None = DEFAULT, vocabulary: str = TASK,
          word_seed: int = 0, num_keys: int = 0, num_values: int = 0,
          positions: str = "moments", distinct_values: bool = False) -> ProbeResult:
  """The ``lookup`` entry of ``PROBES``: the lookup task in each of ``paddings``
  (``lookup_task.ALL_PADDINGS``), target positions drawn by the design ``positions``
  (``lookup_task.POSITION_DESIGNS``).

  ``prompts_per_residue`` 0 takes the smallest group that matches exactly (576 for modulus
  24); ``num_records`` 0 takes min(64, distinct keys, a quarter of the record region's
  tokens) so that padding has room to vary, and then caps ``num_demos`` below the records;
  ``stride`` 0 is the model's chunk size (the stride-repeat check); ``distinct_values``: the
  records' values distinct within a prompt (the retrieval design, ``lookup_shortcuts``). The
  record stores, per padding, the best accuracy of a strategy that never reads the target's
  record (``shortcuts``) beside the model's.
  """
  result, matrices = lookup_test(
      context, lambda spec: predictor(context, vocabulary), modulus=modulus,
      prompts_per_residue=prompts_per_residue, num_records=num_records, num_demos=num_demos,
      paddings=paddings, seed=seed, stride=stride, keys=keys, values=values, filler=filler,
      bos=bos, vocabulary=vocabulary, word_seed=word_seed, num_keys=num_keys,
      num_values=num_values, positions=positions, distinct_values=distinct_values)
  return ProbeResult(result.to_record(), matrices, primary=_primary(context, matrices))


def lookup_test(context: ProbeContext, predict_for, *, modulus: int, prompts_per_residue: int,
                num_records: int, num_demos: int, paddings: Sequence[str], seed: int,
                stride: int, keys, values, filler, bos, vocabulary: str, word_seed: int,
                num_keys: int, num_values: int, positions: str = "moments",
                distinct_values: bool = False,
                name: str = "lookup") -> tuple[ResidueTest, dict[str, correctness.Matrix]]:
  """``probe``'s test and matrices (per padding) with the predictor ``predict_for(spec)``
  (``spec``: the padding's checked ``LookupSpec``); ``name`` is the probe entry errors name."""
  s = _stride(context, stride)
  words = dict(vocabulary=vocabulary, word_seed=word_seed, num_keys=num_keys,
               num_values=num_values)
  specs = [lookup_spec(context, name, modulus=modulus, prompts_per_residue=prompts_per_residue,
                       num_records=num_records, num_demos=num_demos, padding=padding, keys=keys,
                       values=values, filler=filler, bos=bos, positions=positions,
                       distinct_values=distinct_values, **words)
           for padding in paddings]
  if not specs:
    raise ConfigError(f"config field 'sweep.probes.{name}.paddings': name at least one of "
                      f"{', '.join(lookup_task.PADDINGS)}")
  predictors = [predict_for(spec) for spec in specs]  # every one refused before any is run
  modes, matrices, shortcuts, chunks = {}, {}, {}, {}
  for spec, predict in zip(specs, predictors, strict=True):
    prompts = lookup_task.generate(spec, seed)
    modes[spec.padding], matrices[spec.padding], formed = _score(predict, prompts, s)
    shortcuts[spec.padding] = lookup_shortcuts.baselines(spec, prompts).record()
    if formed is not None:
      chunks[spec.padding] = formed
  spec = specs[-1]
  result = ResidueTest("lookup", spec.seq_len, modulus, s, spec.prompts_per_residue,
                       validation_loss(context.trained.workdir), modes,
                       {"num_records": spec.num_records, "num_demos": spec.num_demos,
                        "seed": seed, "positions": positions,
                        "distinct_values": distinct_values, **_vocabulary_settings(spec, **words)},
                       shortcuts, chunks or None)
  return result, matrices


def residue_periods(modulus: int) -> tuple[int, ...]:
  """Candidate periods on the circular residue axis mod ``modulus``: its divisors from 2 to
  modulus / 2 (residues mod 24: 2, 3, 4, 6, 8, 12)."""
  return tuple(p for p in range(2, modulus // 2 + 1) if modulus % p == 0)


def _primary(context: ProbeContext, matrices: Mapping[str, correctness.Matrix]) -> Primary | None:
  """The unit's primary analysis from prefix padding (the paper's main table)."""
  if "prefix" not in matrices:
    return None
  return Primary("lookup", residue_analysis(matrices["prefix"].correct_YxJ, context.chunk_sizes,
                                            **context.analyze_kw))


def residue_analysis(correct_NxM: np.ndarray, chunk_sizes, **analyze_kw) -> stats.Analysis:
  """``stats.analyze`` of a prompts x residues outcome matrix, with its tests at the prompt level.

  Curves, intervals and the gap are those of the residues (columns). The tests are not: the
  prompts of different residues are different prompts, so a prompt, not a column, is the
  exchangeable unit, and shuffling 24 columns cannot reach p < 0.01 at period 12 (two weak
  columns share a phase group by chance 1 time in 23). The phase tests and the period scan
  (candidates: the divisors of the modulus, ``residue_periods``) therefore read the same
  outcomes as one row of N x M prompts whose offsets are 24 i + r (prompt i of residue r): a
  column permutation of that row is a permutation of the prompts' residue labels, and offset
  mod P = r mod P for every P dividing M.
  """
  correct_NxM = np.asarray(correct_NxM, np.float64)
  modulus = correct_NxM.shape[1]
  periods = residue_periods(modulus)
  by_residue = stats.analyze(correct_NxM, np.arange(modulus), chunk_sizes, periods=periods,
                             **analyze_kw)
  flat = correct_NxM.reshape(1, -1)
  kw = dict(analyze_kw, num_resamples=1)  # one row: its bootstrap says nothing, skip it
  by_prompt = stats.analyze(flat, np.arange(flat.shape[1]), chunk_sizes, periods=periods, **kw)
  tests = tuple(dataclasses.replace(t, table=dataclasses.replace(r.table, p_value=t.p_value),
                                    periodic_share=r.periodic_share)
                for t, r in zip(by_prompt.by_chunk_size, by_residue.by_chunk_size, strict=True))
  return dataclasses.replace(
      by_residue, by_chunk_size=tests,
      phase=dataclasses.replace(by_residue.phase, p_value=tests[0].p_value),
      detected_period=by_prompt.detected_period,
      detection_p_value=by_prompt.detection_p_value, period_scan=by_prompt.period_scan)


def needle_probe(context: ProbeContext, modulus: int = 8, prompts_per_residue: int = 0,
                 key_len: int = 2, value_len: int = 2, spread: int = 0, seed: int = 128,
                 stride: int = 0, keys: Sequence[int] | None = None,
                 values: Sequence[int] | None = None, filler: int | None = None,
                 bos: int | str | None = DEFAULT, vocabulary: str = TASK, word_seed: int = 0,
                 num_keys: int = 0, num_values: int = 0) -> ProbeResult:
  """The ``long_needle`` entry of ``PROBES``: records of ``key_len + value_len`` tokens
  filling the model's context, the target within +-``spread`` (0: two periods) of the
  middle, all answer tokens right = retrieved. Matrix ``long_needle_needle``."""
  result, matrices = needle_test(
      context, lambda spec: predictor(context, vocabulary), modulus=modulus,
      prompts_per_residue=prompts_per_residue, key_len=key_len, value_len=value_len,
      spread=spread, seed=seed, stride=stride, keys=keys, values=values, filler=filler,
      bos=bos, vocabulary=vocabulary, word_seed=word_seed, num_keys=num_keys,
      num_values=num_values)
  return ProbeResult(result.to_record(), matrices)


def needle_test(context: ProbeContext, predict_for, *, modulus: int, prompts_per_residue: int,
                key_len: int, value_len: int, spread: int, seed: int, stride: int, keys,
                values, filler, bos, vocabulary: str, word_seed: int, num_keys: int,
                num_values: int,
                name: str = "long_needle") -> tuple[ResidueTest, dict[str, correctness.Matrix]]:
  """``needle_probe``'s test and matrix (``needle``) with the predictor ``predict_for(spec)``
  (``spec``: the checked ``NeedleSpec``); ``name`` is the probe entry errors name."""
  words = dict(vocabulary=vocabulary, word_seed=word_seed, num_keys=num_keys,
               num_values=num_values)
  tokens = _tokens(context, name, keys, values, filler, bos, **words)
  seq_len = context.trained.config.data.seq_len
  spec = _checked(long_needle.NeedleSpec(
      seq_len=seq_len, key_len=key_len, value_len=value_len, modulus=modulus, spread=spread,
      prompts_per_residue=_per_residue(modulus, prompts_per_residue), **tokens), name)
  s = _stride(context, stride)
  summary, matrix, _ = _score(predict_for(spec), long_needle.generate(spec, seed), s)
  result = ResidueTest("long_needle", seq_len, modulus, s, spec.prompts_per_residue,
                       validation_loss(context.trained.workdir), {"needle": summary},
                       {"key_len": key_len, "value_len": value_len,
                        "window": list(spec.window()), "seed": seed,
                        **_vocabulary_settings(spec, **words)})
  return result, {"needle": matrix}
