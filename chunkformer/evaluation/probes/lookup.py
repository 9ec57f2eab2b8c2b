"""The ``lookup`` and ``long_needle`` entries of ``PROBES``: the position-matched tests.

``lookup``: the single-token lookup task (``chunkformer/data/lookup_task.py``) in each padding
mode; ``long_needle``: multi-token records filling the context (``data/long_needle.py``). Both
score the greedy full-vocabulary prediction at the fixed query position and report accuracy by
residue of the target key's position (``residue_accuracy``), the validation loss the run
recorded, and the outcome matrices (``<probe>_<mode>``: prompts x residue).

Tokens default to the model's own task vocabulary (kv symbols split into keys and values, or
letters of the byte-level code task); a loaded model with a tokenizer gets kv rows through its
token map (``context.predict`` maps them). Other tasks must name ``keys``, ``values`` and
``filler``. Rows are the model's ``data.seq_len`` tokens long.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chunkformer import workdir as workdir_lib
from chunkformer.config import ConfigError
from chunkformer.data import long_needle, lookup_task, matched_positions
from chunkformer.evaluation import stats
from chunkformer.evaluation.probes.base import Primary, ProbeContext, ProbeResult
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.stats import residue_accuracy

DEFAULT = "default"  # BOS option: the task's own BOS token


@dataclasses.dataclass(frozen=True)
class ResidueTest:
  """One probe's result: accuracy by residue per padding mode (``modes``)."""

  test: str  # "lookup" | "long_needle"
  seq_len: int
  modulus: int
  stride: int | None
  prompts_per_residue: int
  validation_loss: float | None  # the run's held-out loss at its last step, if recorded
  modes: dict[str, residue_accuracy.ResidueAccuracy]
  settings: dict[str, Any]  # the task fields used (records, demonstrations, key length, ...)

  def to_record(self) -> dict[str, Any]:
    """JSON-ready (tuples as lists), equal to what results.json reads back."""
    return json.loads(json.dumps(dataclasses.asdict(self)))

  @classmethod
  def from_record(cls, record: Mapping[str, Any]) -> ResidueTest:
    return cls(**dict(record, modes={k: residue_accuracy.ResidueAccuracy.from_record(v)
                                     for k, v in record["modes"].items()}))


def validation_loss(workdir: str) -> float | None:
  """The held-out loss the run wrote at its last step (``final_metrics.json``), if any."""
  loss = ((workdir_lib.read_final_metrics(workdir) or {}).get("heldout") or {}).get("loss")
  return None if loss is None else float(loss)


def _tokens(context: ProbeContext, name: str, keys, values, filler, bos) -> dict[str, Any]:
  """keys, values, filler, bos: the options given, the task's defaults for the rest."""
  given = {"keys": keys, "values": values, "filler": filler}
  if all(v is not None for v in given.values()):
    out = {k: tuple(int(i) for i in v) if k != "filler" else int(v) for k, v in given.items()}
    out["bos"] = None if bos in (None, DEFAULT) else int(bos)
    return out
  try:
    out = lookup_task.default_tokens(context.trained.config.data)
  except ValueError as e:
    raise ConfigError(f"config field 'sweep.probes.{name}': {e}") from None
  for k, v in given.items():
    if v is not None:
      out[k] = tuple(int(i) for i in v) if k != "filler" else int(v)
  if bos != DEFAULT:
    out["bos"] = None if bos is None else int(bos)
  return out


def _stride(context: ProbeContext, stride: int) -> int | None:
  return stride or (context.chunk_sizes[0] if context.chunk_sizes else None)


def _per_residue(modulus: int, prompts_per_residue: int) -> int:
  return prompts_per_residue or matched_positions.smallest_group(modulus)


def _score(context: ProbeContext, prompts: lookup_task.Prompts, stride: int | None):
  predictions = context.predict(prompts.rows())["predictions"]
  outcomes = prompts.correct(predictions)
  summary = residue_accuracy.summarize(outcomes, prompts.residues, prompts.modulus, stride)
  matrix = correctness.Matrix(
      residue_accuracy.by_residue(outcomes, prompts.residues, prompts.modulus).astype(np.float64),
      np.arange(prompts.modulus))
  return summary, matrix


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
                bos) -> lookup_task.LookupSpec:
  """The lookup task of probe ``name`` on the context's model (defaults as in ``probe``),
  checked: a ConfigError naming ``sweep.probes.<name>`` and the field otherwise."""
  tokens = _tokens(context, name, keys, values, filler, bos)
  spec = lookup_task.LookupSpec(seq_len=context.trained.config.data.seq_len, modulus=modulus,
                                num_demos=num_demos, padding=padding,
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
          filler: int | None = None, bos: int | str | None = DEFAULT) -> ProbeResult:
  """The ``lookup`` entry of ``PROBES``: the lookup task in each of ``paddings``.

  ``prompts_per_residue`` 0 takes the smallest group that matches exactly (576 for modulus
  24); ``num_records`` 0 takes min(64, distinct keys, a quarter of the record region's
  tokens) so that padding has room to vary, and then caps ``num_demos`` below the records;
  ``stride`` 0 is the model's chunk size (the stride-repeat check).
  """
  s = _stride(context, stride)
  modes, matrices, spec = {}, {}, None
  for padding in paddings:
    spec = lookup_spec(context, "lookup", modulus=modulus,
                       prompts_per_residue=prompts_per_residue, num_records=num_records,
                       num_demos=num_demos, padding=padding, keys=keys, values=values,
                       filler=filler, bos=bos)
    modes[padding], matrices[padding] = _score(context, lookup_task.generate(spec, seed), s)
  if spec is None:
    raise ConfigError("config field 'sweep.probes.lookup.paddings': name at least one of "
                      f"{', '.join(lookup_task.PADDINGS)}")
  result = ResidueTest("lookup", spec.seq_len, modulus, s, spec.prompts_per_residue,
                       validation_loss(context.trained.workdir), modes,
                       {"num_records": spec.num_records, "num_demos": spec.num_demos,
                        "seed": seed})
  return ProbeResult(result.to_record(), matrices, primary=_primary(context, matrices))


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
                 bos: int | str | None = DEFAULT) -> ProbeResult:
  """The ``long_needle`` entry of ``PROBES``: records of ``key_len + value_len`` tokens
  filling the model's context, the target within +-``spread`` (0: two periods) of the
  middle, all answer tokens right = retrieved. Matrix ``long_needle_needle``."""
  tokens = _tokens(context, "long_needle", keys, values, filler, bos)
  seq_len = context.trained.config.data.seq_len
  spec = _checked(long_needle.NeedleSpec(
      seq_len=seq_len, key_len=key_len, value_len=value_len, modulus=modulus, spread=spread,
      prompts_per_residue=_per_residue(modulus, prompts_per_residue), **tokens), "long_needle")
  s = _stride(context, stride)
  summary, matrix = _score(context, long_needle.generate(spec, seed), s)
  result = ResidueTest("long_needle", seq_len, modulus, s, spec.prompts_per_residue,
                       validation_loss(context.trained.workdir), {"needle": summary},
                       {"key_len": key_len, "value_len": value_len,
                        "window": list(spec.window()), "seed": seed})
  return ProbeResult(result.to_record(), {"needle": matrix})
