"""The needle shift sweep under inference-time eviction: accuracy by position per policy.

The registered probe ``eviction_needles``: for every policy of its ``policies`` option (config
dicts, ``eviction.from_dict``: ``dict(policy="chunkkv", budget=64, chunk=8, window=8)``) the
needle shift sweep's rows go through an ``evicting.EvictingPredictor``: the cache is pruned
once the prompt is read, then the rest of the row is decoded from the pruned cache. Where the
prompt ends (``prompt_end``):
- ``question`` (SnapKV's setting): right before the first scored answer token, so the
  observation window holds the query (all but its last key token);
- ``haystack`` (kvpress's question-agnostic setting): where the query region starts.
The sweep itself is the engine's (``evaluation.probes.policy_needles``): each policy's record
holds its budget in tokens and, per depth, the accuracy by needle offset and by offset mod L
for each L of ``phase_sizes``, the unit's chunk sizes and the policy's own chunk length
(ChunkKV's grid starts at position 0, so a needle's phase is its offset mod L); its
correctness matrices are stored as ``eviction_needles_<matrix key>`` (``matrix_key``: the
policy label and the depth; the record names it per depth) so that claims can recompute
everything.
A model with other than full-attention layers is refused (ConfigError naming the layer). For a
loaded model with a tokenizer the rows and a content policy's delimiter ids (kv ids in the
config) are mapped to the model's own ids.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from chunkformer import eviction, run_tokens
from chunkformer.config_sections.errors import one_of
from chunkformer.data import kv
from chunkformer.evaluation.probes import evicting, loaded_model, needle_sweep, policy_needles
from chunkformer.evaluation.probes.base import ProbeContext, ProbeResult
from chunkformer.eviction import prune

FIELD = "sweep.probes.eviction_needles"
PROMPT_ENDS = ("question", "haystack")
matrix_key = policy_needles.matrix_key  # a policy's matrix at one depth (the lookup's too)


def prompt_length(sweep: needle_sweep.SweepRows, config, prompt_end: str) -> int:
  """Tokens prefilled before eviction for one depth's rows (the same for every row)."""
  if prompt_end == "haystack":
    return kv.query_start(config)
  return policy_needles.answer_start(sweep)


def chosen_policies(specs: Sequence[Mapping[str, Any]],
                    field: str = FIELD) -> list[tuple[dict, eviction.Policy]]:
  """(the config's dict, the policy) of each listed policy; ConfigError naming the entry of
  ``field`` (the probe's ``sweep.probes.<name>``)."""
  return policy_needles.chosen(specs, field, "policies", "policy",
                               lambda spec, where: eviction.from_dict(spec, field=where),
                               lambda _, policy: eviction.label(policy))


def check_options(policies: Sequence[Mapping[str, Any]] = (), prompt_end: str = "question",
                  **_) -> None:
  """The options a sweep config gives this probe, checked before anything trains
  (``registry.check``): ConfigError naming the bad entry."""
  chosen_policies(policies)
  one_of(prompt_end, PROMPT_ENDS, f"{FIELD}.prompt_end")


def own_sizes(policy: eviction.Policy) -> list[int]:
  """A grid's own chunk length (ChunkKV's), the phase length its accuracy is also read at."""
  return [policy.chunk] if isinstance(policy, eviction.ChunkKV) else []


def phase_sizes_for(policy: eviction.Policy, unit_sizes: Sequence[int],
                    extra: Sequence[int]) -> list[int]:
  """The L a policy's accuracy is read at: the option's, the unit's and a grid's own chunk."""
  return policy_needles.phase_sizes(extra, unit_sizes, own_sizes(policy))


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
  chosen = chosen_policies(policies)
  one_of(prompt_end, PROMPT_ENDS, f"{FIELD}.prompt_end")
  sweeps = policy_needles.kv_rows(context, num_offsets, num_haystacks, depths)
  if sweeps is None:
    return ProbeResult(None)
  config = context.trained.config
  prune.check_model(config.model)
  lengths = {s.name: prompt_length(s, config.data, prompt_end) for s in sweeps}
  mapping = run_tokens.for_run(context.trained.workdir, config)
  for _, policy in chosen:  # every budget checked against every prompt before any prediction
    for length in set(lengths.values()):
      policy.tokens(length)

  def setting(spec: dict, policy: eviction.Policy) -> policy_needles.Setting:
    mapped = in_model_tokens(policy, mapping)
    return policy_needles.Setting(
        eviction.label(policy), own_sizes(policy),
        lambda sweep: loaded_model.adapt(context.trained, evicting.EvictingPredictor(
            context.trained, batch_size, mapped, lengths[sweep.name])),
        lambda: {"policy": spec, "prompt_tokens": sorted(set(lengths.values())),
                 "budget_tokens": sorted({policy.tokens(n) for n in lengths.values()})})

  return policy_needles.run(context, [setting(*c) for c in chosen], sweeps, phase_sizes)
