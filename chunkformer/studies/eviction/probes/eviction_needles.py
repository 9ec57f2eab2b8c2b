"""The needle shift sweep under inference-time eviction: accuracy by position per policy.

The registered probe ``eviction_needles``: for every policy of its ``policies`` option (config
dicts, ``eviction.from_dict``: ``dict(policy="chunkkv", budget=64, chunk=8, window=8)``) the
needle shift sweep's rows go through an ``evicting.EvictingPredictor``: the cache is pruned
once the prompt is read, then the rest of the row is decoded from the pruned cache. Where the
prompt ends (``prompt_end``):
- ``question`` (SnapKV's setting): right before the first scored answer token, so the
  observation window holds the query (all but its last key token);
- ``haystack`` (kvpress's question-agnostic setting): where the query region starts.
Each policy's record holds its budget in tokens and, per depth, the accuracy by needle offset
and by offset mod L for each L of ``phase_sizes``, the unit's chunk sizes and the policy's own
chunk length (ChunkKV's grid starts at position 0, so a needle's phase is its offset mod L);
its correctness matrices are stored as
``eviction_needles_<matrix key>`` (``matrix_key``: the policy label and the depth; the record
names it per depth) so that claims can recompute everything.
A model with other than full-attention layers is refused (ConfigError naming the layer). For a
loaded model with a tokenizer the rows and a content policy's delimiter ids (kv ids in the
config) are mapped to the model's own ids.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chunkformer import eviction, run_tokens
from chunkformer.config_sections.errors import ConfigError, one_of
from chunkformer.data import kv
from chunkformer.evaluation.probes import evicting, loaded_model, needle_sweep
from chunkformer.evaluation.probes.base import ProbeContext, ProbeResult
from chunkformer.evaluation.records import correctness
from chunkformer.eviction import prune

FIELD = "sweep.probes.eviction_needles"
PROMPT_ENDS = ("question", "haystack")


def prompt_length(sweep: needle_sweep.SweepRows, config, prompt_end: str) -> int:
  """Tokens prefilled before eviction for one depth's rows (the same for every row)."""
  if prompt_end == "haystack":
    return kv.query_start(config)
  starts = np.unique(sweep.answer_start_N)
  if starts.size != 1:
    raise ValueError(f"depth {sweep.name}: rows answer at {starts.tolist()}; one prompt "
                     "length per depth is needed")
  return int(starts[0])


def matrix_key(label: str, depth_name: str) -> str:
  """The key of one policy's matrix at one depth (stored as ``eviction_needles_<key>``): the
  policy's label with '.' (a share of the prompt, several delimiter ids) written as 'p', since
  a stored matrix name holds no '.'."""
  return f"{label.replace('.', 'p')}_{depth_name}"


def by_phase(correct_YxJ: np.ndarray, offsets_J: np.ndarray, size: int) -> list[float]:
  """Accuracy of the needles at offset mod ``size`` = 0 .. size - 1 (None where none)."""
  phase_J = offsets_J % size
  return [float(correct_YxJ[:, phase_J == p].mean()) if (phase_J == p).any() else None
          for p in range(size)]


def _plain(spec: Any) -> dict[str, Any]:
  spec = spec.to_dict() if hasattr(spec, "to_dict") else dict(spec)  # ConfigDict or dict
  return {k: list(v) if isinstance(v, tuple) else v for k, v in spec.items()}


def chosen_policies(specs: Sequence[Mapping[str, Any]],
                    field: str = FIELD) -> list[tuple[dict, eviction.Policy]]:
  """(the config's dict, the policy) of each listed policy; ConfigError naming the entry of
  ``field`` (the probe's ``sweep.probes.<name>``)."""
  if isinstance(specs, (str, bytes, Mapping)) or not specs:
    raise ConfigError(f"config field '{field}.policies': give a list of policy dicts, got "
                      f"{specs!r}")
  chosen = [(_plain(s), eviction.from_dict(_plain(s), field=f"{field}.policies[{i}]"))
            for i, s in enumerate(specs)]
  labels = [eviction.label(p) for _, p in chosen]
  if len(set(labels)) != len(labels):
    raise ConfigError(f"config field '{field}.policies': a policy is listed twice ({labels})")
  return chosen


def check_options(policies: Sequence[Mapping[str, Any]] = (), prompt_end: str = "question",
                  **_) -> None:
  """The options a sweep config gives this probe, checked before anything trains
  (``registry.check``): ConfigError naming the bad entry."""
  chosen_policies(policies)
  one_of(prompt_end, PROMPT_ENDS, f"{FIELD}.prompt_end")


def phase_sizes_for(policy: eviction.Policy, unit_sizes: Sequence[int],
                    extra: Sequence[int]) -> list[int]:
  """The L a policy's accuracy is read at: the option's, the unit's and a grid's own chunk."""
  own = [policy.chunk] if isinstance(policy, eviction.ChunkKV) else []
  return sorted({*(int(m) for m in extra), *unit_sizes, *own})


def in_model_tokens(policy: eviction.Policy, mapping) -> eviction.Policy:
  """The policy with its delimiter ids (kv ids in a config) mapped to a loaded model's ids."""
  if mapping is None or not isinstance(policy, eviction.ContentChunkKV) or not isinstance(
      policy.boundaries, eviction.Delimiter):
    return policy
  ids = tuple(int(i) for i in mapping.to_model[list(policy.boundaries.ids)])
  return dataclasses.replace(policy, boundaries=dataclasses.replace(policy.boundaries, ids=ids))


def probe(context: ProbeContext, policies: Sequence[Mapping[str, Any]] = (),
          prompt_end: str = "question", num_offsets: int = 24, num_haystacks: int = 8,
          depths: Sequence[float] = (0.0,), phase_sizes: Sequence[int] = (),
          batch_size: int = 32) -> ProbeResult:
  """Accuracy by needle offset and phase under each policy (kv models; others record None)."""
  config = context.trained.config
  if config.data.task != "kv":
    return ProbeResult(None)
  chosen = chosen_policies(policies)
  one_of(prompt_end, PROMPT_ENDS, f"{FIELD}.prompt_end")
  prune.check_model(config.model)
  spec = needle_sweep.NeedleSweepSpec(num_offsets, num_haystacks, tuple(float(d) for d in depths),
                                      seed=context.seed)
  sweeps = needle_sweep.build(config.data, spec)
  lengths = {s.name: prompt_length(s, config.data, prompt_end) for s in sweeps}
  mapping = run_tokens.for_run(context.trained.workdir, config)
  for _, policy in chosen:  # every budget checked against every prompt before any prediction
    for length in set(lengths.values()):
      policy.tokens(length)
  record, matrices = {}, {}
  for spec_dict, policy in chosen:
    name = eviction.label(policy)
    sizes = phase_sizes_for(policy, context.chunk_sizes, phase_sizes)
    depth_records = {}
    for sweep in sweeps:
      predictor = loaded_model.adapt(context.trained, evicting.EvictingPredictor(
          context.trained, batch_size, in_model_tokens(policy, mapping), lengths[sweep.name]))
      (result,) = needle_sweep.run(predictor, [sweep])
      key = matrix_key(name, result.name)
      matrices[key] = correctness.Matrix(result.correct_YxJ, result.offsets_J)
      depth_records[result.name] = {
          "matrix": key,
          "accuracy": float(result.correct_YxJ.mean()),
          "accuracy_by_offset": [float(a) for a in result.correct_YxJ.mean(axis=0)],
          "accuracy_by_phase": {str(m): by_phase(result.correct_YxJ, result.offsets_J, m)
                                for m in sizes},
      }
    record[name] = {
        "policy": spec_dict, "prompt_tokens": sorted(set(lengths.values())),
        "budget_tokens": sorted({policy.tokens(n) for n in lengths.values()}),
        "offsets": [int(o) for o in sweeps[0].offsets_J], "depths": depth_records}
  return ProbeResult(record, matrices)
