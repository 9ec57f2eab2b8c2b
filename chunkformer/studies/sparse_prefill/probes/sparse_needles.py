"""The needle shift sweep under a sparse prefill: accuracy by needle position per pattern.

The registered probe ``sparse_needles``: for every pattern of its ``patterns`` option (config
dicts: ``dict(pattern="block_sparse", block=8, top=4)``; ``block`` is the plan's block of
queries and keys in tokens, the rest ``sparse_prefill.from_dict``'s settings) the needle shift
sweep's rows go through a ``SparsePrefillPredictor``: the prompt is prefilled by
``decode.prefill(..., sparse=Plan.uniform(model, pattern, block=block))`` and the rest of the
row is decoded densely from the cache that prefill wrote. Where the prompt ends
(``prompt_end``):
- ``answer`` (a sparse prefill's setting: the whole prompt, question included, is prefilled):
  after the query's last key token, so the first answer token is predicted by the sparse
  prefill's last position;
- ``question`` (the eviction probe's): right before the query's last key token, which is then
  decoded densely with the answer; only the cache the sparse prefill wrote is sparse.
The sweep itself is the engine's (``evaluation.probes.policy_needles``): each pattern's record
holds its block, the mean fraction of causal (query, key) pairs its index sets keep on the
first batch's prompts (``kept_fraction``, over rows, layers and heads) and, per depth, the
accuracy by needle offset and by offset mod L for each L of ``phase_sizes``, the unit's chunk
sizes and the pattern's own block; its correctness matrices are stored as
``sparse_needles_<label>_<depth>`` so that claims can recompute everything.
A model with other than full-attention layers is refused (ConfigError from the plan).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from chunkformer import sparse_prefill
from chunkformer.config_sections.errors import one_of, require
from chunkformer.evaluation.probes import decoding, needle_sweep, policy_needles
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.probes.base import ProbeContext, ProbeResult
from chunkformer.sparse_prefill import search

FIELD = "sweep.probes.sparse_needles"
PROMPT_ENDS = ("answer", "question")


def label(spec: Mapping[str, Any]) -> str:
  """A pattern's stable name with its block: ``block_sparse-k4-b8``."""
  return f"{pattern_of(spec).label()}-b{int(spec['block'])}"


def pattern_of(spec: Mapping[str, Any], field: str = FIELD) -> sparse_prefill.Pattern:
  spec = {k: v for k, v in dict(spec).items() if k != "block"}
  return sparse_prefill.from_dict(spec, field=field)


def _checked(spec: dict[str, Any], where: str) -> sparse_prefill.Pattern:
  block = spec.get("block")
  require(isinstance(block, int) and not isinstance(block, bool) and block >= 1,
          f"{where}.block", f"must be an int >= 1 (tokens per block), got {block!r}")
  return pattern_of(spec, where)


def chosen_patterns(specs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  """The config's pattern dicts, checked: ConfigError naming the bad entry."""
  return [spec for spec, _ in policy_needles.chosen(specs, FIELD, "patterns", "pattern",
                                                    _checked, lambda spec, _: label(spec))]


def check_options(patterns: Sequence[Mapping[str, Any]] = (), prompt_end: str = "answer",
                  **_) -> None:
  """The options a sweep config gives this probe, checked before anything trains."""
  chosen_patterns(patterns)
  one_of(prompt_end, PROMPT_ENDS, f"{FIELD}.prompt_end")


class SparsePrefillPredictor(decoding.DecodingPredictor):
  """``trained.Predictor``: the first ``prompt_len`` tokens of each row prefilled sparsely by
  ``plan``, the rest fed one by one (teacher forcing) through ``decode.step``."""

  def __init__(self, trained: trained_lib.TrainedModel, batch_size: int,
               plan: sparse_prefill.Plan, prompt_len: int):
    super().__init__(trained, batch_size, prompt_len, sparse=plan)
    plan.check(trained.config.model)
    self.plan = plan

  def kept_fraction(self, inputs_BxT: np.ndarray) -> float:
    """The mean fraction of causal pairs the plan's index sets keep on these prompts."""
    with self.trained.runtime.context():
      indices = search.prefill_indices(self.trained.runtime.model, self.trained.params,
                                       jnp.asarray(inputs_BxT[:, :self.prompt_len]), self.plan)
    found = [np.asarray(sparse_prefill.kept_fraction(i, self.prompt_len, self.plan.block))
             for i in indices if i is not None]
    return float(np.mean(found))


def prompt_length(sweep: needle_sweep.SweepRows, prompt_end: str = "answer") -> int:
  """Tokens prefilled for one depth's rows (the same for every row). The first scored target
  is predicted at index ``answer_start``: ``answer`` prefills through it, ``question`` stops
  right before it."""
  return policy_needles.answer_start(sweep) + (prompt_end == "answer")


def probe(context: ProbeContext, patterns: Sequence[Mapping[str, Any]] = (),
          prompt_end: str = "answer", num_offsets: int = 24, num_haystacks: int = 8,
          depths: Sequence[float] = (0.0,), phase_sizes: Sequence[int] = (),
          batch_size: int = 32) -> ProbeResult:
  """Accuracy by needle offset and phase under each pattern (kv models; others record None)."""
  check_options(patterns, prompt_end)
  sweeps = policy_needles.kv_rows(context, num_offsets, num_haystacks, depths)
  if sweeps is None:
    return ProbeResult(None)
  model = context.trained.config.model

  def setting(spec: dict[str, Any]) -> policy_needles.Setting:
    block, kept = int(spec["block"]), []
    plan = sparse_prefill.Plan.uniform(model, pattern_of(spec), block=block)

    def predictor(sweep: needle_sweep.SweepRows) -> SparsePrefillPredictor:
      found = SparsePrefillPredictor(context.trained, batch_size, plan,
                                     prompt_length(sweep, prompt_end))
      kept.append(found.kept_fraction(sweep.rows["inputs"][:batch_size]))
      return found

    return policy_needles.Setting(
        label(spec), (block,), predictor,
        lambda: {"pattern": spec, "block": block, "prompt_end": prompt_end,
                 "prompt_tokens": sorted({prompt_length(s, prompt_end) for s in sweeps}),
                 "kept_fraction": float(np.mean(kept))})

  return policy_needles.run(context, map(setting, chosen_patterns(patterns)), sweeps,
                           phase_sizes)
