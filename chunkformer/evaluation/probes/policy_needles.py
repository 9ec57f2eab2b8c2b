"""The needle shift sweep under an inference-time setting applied at prefill (an eviction
policy, a sparse-prefill pattern): accuracy by needle offset and phase, per setting and depth.

A study's probe reads its list of settings from the sweep config (``chosen``: config dicts,
each parsed by the study, ConfigError naming the bad entry or a label listed twice), builds the
needle sweep's rows (``kv_rows``; kv models only) and describes each setting as a ``Setting``: its
label, the phase lengths of its own (a grid's chunk, a pattern's block), the predictor that
answers one depth's rows with the setting applied, and the record fields of its own. ``run``
sweeps the needle under each: per depth the accuracy, the accuracy by needle offset and by
offset mod L for each L of the options' ``phase_sizes``, the unit's chunk sizes and the
setting's own lengths (``phase_sizes``). Each setting's correctness matrices are stored as
``<probe>_<matrix key>`` (``matrix_key``: the label and the depth; the record names it per
depth) so that claims can recompute everything (``claims.policy_groups`` reads them back).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from chunkformer.config_sections.errors import ConfigError
from chunkformer.evaluation.probes import needle_sweep
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.probes.base import ProbeContext, ProbeResult
from chunkformer.evaluation.records import correctness


def plain(spec: Any) -> dict[str, Any]:
  """A config entry (ConfigDict or dict) as a dict, tuples written as lists (as JSON does)."""
  spec = spec.to_dict() if hasattr(spec, "to_dict") else dict(spec)
  return {k: list(v) if isinstance(v, tuple) else v for k, v in spec.items()}


def chosen(specs: Sequence[Mapping[str, Any]], field: str, option: str, noun: str,
           parse: Callable[[dict[str, Any], str], Any],
           label: Callable[[dict[str, Any], Any], str]) -> list[tuple[dict[str, Any], Any]]:
  """(the config's dict, what ``parse`` made of it) for each entry of ``<field>.<option>``
  (``noun``: what one entry is, for the messages); ``parse(spec, where)`` raises ConfigError
  naming ``where``; two entries of one ``label`` are refused."""
  if isinstance(specs, (str, bytes, Mapping)) or not specs:
    raise ConfigError(f"config field '{field}.{option}': give a list of {noun} dicts, got "
                      f"{specs!r}")
  found = []
  for i, entry in enumerate(specs):
    spec = plain(entry)
    found.append((spec, parse(spec, f"{field}.{option}[{i}]")))
  labels = [label(s, parsed) for s, parsed in found]
  if len(set(labels)) != len(labels):
    raise ConfigError(f"config field '{field}.{option}': a {noun} is listed twice ({labels})")
  return found


def answer_start(sweep: needle_sweep.SweepRows) -> int:
  """The index of the first scored target, the same in every row of one depth's rows."""
  starts = np.unique(sweep.answer_start_N)
  if starts.size != 1:
    raise ValueError(f"depth {sweep.name}: rows answer at {starts.tolist()}; one prompt "
                     "length per depth is needed")
  return int(starts[0])


def matrix_key(label: str, depth_name: str) -> str:
  """The key of one setting's matrix at one depth (stored as ``<probe>_<key>``): the label
  with '.' (a share of the prompt, several delimiter ids) written as 'p', since a stored
  matrix name holds no '.'."""
  return f"{label.replace('.', 'p')}_{depth_name}"


def by_phase(correct_YxJ: np.ndarray, offsets_J: np.ndarray, size: int) -> list[float | None]:
  """Accuracy of the needles at offset mod ``size`` = 0 .. size - 1 (None where none)."""
  phase_J = offsets_J % size
  return [float(correct_YxJ[:, phase_J == p].mean()) if (phase_J == p).any() else None
          for p in range(size)]


def phase_sizes(extra: Sequence[int], unit_sizes: Sequence[int],
                own: Sequence[int] = ()) -> list[int]:
  """The L a setting's accuracy is read at: the option's, the unit's and the setting's own."""
  return sorted({*(int(m) for m in extra), *unit_sizes, *own})


def kv_rows(context: ProbeContext, num_offsets: int, num_haystacks: int,
            depths: Sequence[float]) -> list[needle_sweep.SweepRows] | None:
  """The needle sweep's rows of every depth, haystacks drawn from the sweep's seed; None for
  a model not trained on the kv task (its probe records None)."""
  if context.trained.config.data.task != "kv":
    return None
  spec = needle_sweep.NeedleSweepSpec(num_offsets, num_haystacks, tuple(float(d) for d in depths),
                                      seed=context.seed)
  return needle_sweep.build(context.trained.config.data, spec)


@dataclasses.dataclass(frozen=True)
class Setting:
  """One inference-time setting the needle is swept under."""

  label: str  # the record's key, and its matrices' (``matrix_key``)
  own_sizes: Sequence[int]  # phase lengths of its own (a grid's chunk, a pattern's block)
  predictor: Callable[[needle_sweep.SweepRows], trained_lib.Predictor]  # for one depth's rows
  fields: Callable[[], dict[str, Any]]  # its own record fields, asked once its depths ran


def run(context: ProbeContext, settings: Iterable[Setting],
        sweeps: Sequence[needle_sweep.SweepRows], extra_sizes: Sequence[int]) -> ProbeResult:
  """Each setting's record (its own fields, the offsets, per depth the accuracies and the
  name of its matrix) and its matrices, in the order of ``settings``."""
  record, matrices = {}, {}
  for setting in settings:
    sizes = phase_sizes(extra_sizes, context.chunk_sizes, setting.own_sizes)
    depth_records = {}
    for sweep in sweeps:
      (result,) = needle_sweep.run(setting.predictor(sweep), [sweep])
      key = matrix_key(setting.label, result.name)
      matrices[key] = correctness.Matrix(result.correct_YxJ, result.offsets_J)
      depth_records[result.name] = {
          "matrix": key,
          "accuracy": float(result.correct_YxJ.mean()),
          "accuracy_by_offset": [float(a) for a in result.correct_YxJ.mean(axis=0)],
          "accuracy_by_phase": {str(m): by_phase(result.correct_YxJ, result.offsets_J, m)
                                for m in sizes},
      }
    record[setting.label] = {**setting.fields(),
                             "offsets": [int(o) for o in sweeps[0].offsets_J],
                             "depths": depth_records}
  return ProbeResult(record, matrices)
