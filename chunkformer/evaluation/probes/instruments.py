"""The sweep's built-in probes: entries of ``PROBES`` like any other, over the probe modules.

Each gives the typed ``records.variant.VariantRecord`` fields the claims read (``base``):
- ``needle_sweep`` (retrieval models): the needle shift sweep at every depth (``needle_sweep``;
  window starts share their phase, so ``all_depths`` pools them): ``primary_depth``,
  ``token_accuracy_by_offset``, ``depths``, ``all_depths``, ``near_accuracy``, for dynamic
  models ``chunk_phase`` (the phase inside the chunk the needle actually landed in), for plain
  fixed models with multi-token needles ``split_labels`` (C5). The far depth's analysis is the
  unit's primary one ("needle").
- ``prefix_probe``: accuracy by prefix length N (``prefix_probe``; for code prompts with
  needles also by N mod M and by each needle's own phase): ``prefix_probe``; the primary
  analysis ("prefix") of a model without a needle sweep (code models).
- ``slot_gain``: the realised pooling weight per slot on held-out rows (``slot_gain``) and the
  same statistic of this config's initialised model on the same rows (C6's null):
  ``slot_gain``, ``slot_gain_init``; dynamic models: ``heldout_compression_ratio``, measured
  from the end flags they used, never assumed.
(The language-model study registers ``lm_phase_loss``, a typed-field probe of the same kind:
``chunkformer.studies.lm``.)
A built-in that does not apply to a unit (the needle sweep of a code model) gives no fields.
Each function's keyword defaults are its options' defaults (``sweep.probes.<name>``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from chunkformer.evaluation import stats
from chunkformer.evaluation.probes import (
  loaded_model,
  needle_sweep,
  prefix_probe,
  slot_gain,
  split_fields,
)
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.probes.base import Figure, Primary, ProbeContext, ProbeResult
from chunkformer.evaluation.probes.sown_boundaries import end_flags
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.variant import SlotGainSite
from chunkformer.evaluation.stats.analysis_types import (
  DepthAnalysis,
  PrefixAnalysis,
  as_float,
  as_floats,
)


def predictor(trained: trained_lib.TrainedModel, batch_size: int) -> trained_lib.Predictor:
  """Predictions plus the dynamic end flags (``ends``) and the slot-gain sums, per row."""
  model = trained.config.model

  def extract(collections, rows):
    intermediates = collections.get(trained_lib.INTERMEDIATES, {})
    out = slot_gain.extract(intermediates)
    ends = end_flags(model, intermediates)
    if ends is not None:
      out["ends"] = ends.astype(np.int8)
    return out

  return loaded_model.adapt(trained, trained_lib.Predictor(trained, batch_size, extract=extract))


def needle_spec(chunk_sizes: Sequence[int], seed: int, num_offsets: int, num_haystacks: int,
                depths: Sequence[float]) -> needle_sweep.NeedleSweepSpec:
  """The needle sweep of a sweep whose chunk sizes in play are ``chunk_sizes``: windows aligned
  to their lcm; ``num_offsets`` 0 = the smallest multiple of it >= 3 x the largest M."""
  align = math.lcm(*chunk_sizes)
  if not num_offsets:
    num_offsets = align * math.ceil(3 * max(chunk_sizes) / align)
  return needle_sweep.NeedleSweepSpec(num_offsets=num_offsets, num_haystacks=num_haystacks,
                                      depths=tuple(depths), align=align, seed=seed)


def prefix_spec(chunk_sizes: Sequence[int], seed: int, prompts: int, max_prefix: int,
                code_needles: int) -> prefix_probe.PrefixSpec:
  """The prefix probe: N = 0..max_prefix (0 = 3 x the largest M in play), ``prompts`` prompts."""
  return prefix_probe.PrefixSpec(max_prefix=max_prefix or 3 * max(chunk_sizes),
                                 num_prompts=prompts, code_needles=code_needles, seed=seed)


def _band(curve) -> tuple:
  return curve.values, curve.low, curve.high


def _in_play(context: ProbeContext) -> tuple[int, ...]:
  return context.sweep_chunk_sizes or context.chunk_sizes


def run_needle_sweep(context: ProbeContext, num_offsets: int = 0, num_haystacks: int = 32,
                     depths: Sequence[float] = (0.0, 0.5, 1.0)) -> ProbeResult:
  """The ``needle_sweep`` entry (module docstring): K offsets x ``num_haystacks`` haystacks at
  each depth (0 = far ... 1 = near)."""
  config = context.unit_config
  if config.data.task != "kv":
    return ProbeResult(fields={})
  sizes, kw, unit = list(context.chunk_sizes), context.analyze_kw, context.unit
  spec = needle_spec(_in_play(context), context.seed, num_offsets, num_haystacks, depths)
  results = needle_sweep.run(context.predict, needle_sweep.build(config.data, spec))
  far = min(results, key=lambda r: r.depth)
  matrices = {correctness.needle_name(r.name): correctness.Matrix(r.correct_YxJ, r.offsets_J,
                                                                  r.phases_YxJ)
              for r in results}
  primary = stats.analyze(far.correct_YxJ, far.offsets_J, sizes, **kw)
  fields = dict(
      primary_depth=far.name,
      token_accuracy_by_offset=as_floats(far.token_accuracy_YxJ.mean(axis=0)),
      depths=tuple(
          DepthAnalysis(stats.analyze(r.correct_YxJ, r.offsets_J, sizes, **kw).nested(),
                        depth=float(r.depth), depth_name=r.name,
                        mean_distance=float(r.mean_distance),
                        token_accuracy=float(r.token_accuracy_YxJ.mean()),
                        compression_ratio=as_float(r.compression_ratio))
          for r in results),
      all_depths=stats.analyze(np.concatenate([r.correct_YxJ for r in results]), far.offsets_J,
                               sizes, **kw).nested())
  figures = [Figure("", "analysis", (primary,), {"name": unit}, primary_only=True)]
  if far.phases_YxJ is not None:
    chunk_phase = stats.analyze(far.correct_YxJ, far.offsets_J, sizes, phases=far.phases_YxJ,
                                **kw).phase
    fields["chunk_phase"] = chunk_phase
    figures.append(Figure(
        "accuracy per phase inside the actual chunk", "phase_accuracy",
        (chunk_phase.phases, *_band(chunk_phase.accuracy)),
        dict(xlabel="needle phase inside its actual chunk",
             title=f"{unit}: accuracy per phase inside the chunk the needle landed in"),
        file=f"{unit}_chunk_phases.png"))
  fields["near_accuracy"] = float(max(results, key=lambda r: r.depth).correct_YxJ.mean())
  if context.setup is not None and split_fields.wants_split_labels(context.setup):
    # C5: accuracy per split label, the labels fixed in advance
    fields["split_labels"] = split_fields.split_fields(
        context.setup, far.correct_YxJ, far.offsets_J, depth_name=far.name, seed=context.seed,
        num_resamples=context.num_resamples)
  return ProbeResult(fields=fields, matrices=matrices, figures=tuple(figures),
                     primary=Primary("needle", primary))


def run_prefix_probe(context: ProbeContext, prompts: int = 32, max_prefix: int = 0,
                     code_needles: int = 4) -> ProbeResult:
  """The ``prefix_probe`` entry (module docstring): ``prompts`` prompts padded by N = 0..
  ``max_prefix`` tokens; ``code_needles`` needles per code prompt whose data has none.
  Lookup models decline: their test is the ``lookup`` probe."""
  if context.unit_config.data.task == "lookup":
    return ProbeResult(fields={})
  sizes, unit = list(context.chunk_sizes), context.unit
  spec = prefix_spec(_in_play(context), context.seed, prompts, max_prefix, code_needles)
  rows = prefix_probe.build(context.unit_config.data, spec)
  probe = prefix_probe.run(context.predict, rows)
  analysis = stats.analyze(probe.correct_YxJ, probe.prefixes_J, sizes, **context.analyze_kw)
  nested = PrefixAnalysis(
      analysis.nested(), as_floats(probe.token_accuracy_YxJ.mean(axis=0)),
      code_accuracy_by_prefix=(None if probe.code_accuracy_YxJ is None
                               else as_floats(probe.code_accuracy_YxJ.mean(axis=0))),
      boundary_agreement_by_prefix=(None if probe.boundary_agreement_J is None
                                    else as_floats(probe.boundary_agreement_J)),
      needle_phases=prefix_probe.needle_phases(rows, probe, sizes[0]))
  extra = {}
  if nested.code_accuracy_by_prefix is not None:
    extra["code byte accuracy"] = nested.code_accuracy_by_prefix
  if nested.boundary_agreement_by_prefix is not None:
    extra["boundary agreement"] = nested.boundary_agreement_by_prefix
  figures = (
      Figure("prefix probe: accuracy vs prefix length", "prefix_probe",
             (probe.prefixes_J, *_band(analysis.accuracy_by_offset)),
             dict(chunk_size=sizes[0], extra=extra,
                  title=f"{unit}: prefix probe (p = {analysis.p_value:.3g} at M={sizes[0]})"),
             file=f"{unit}_prefix.png"),
      Figure("accuracy per phase of the prefix", "phase_accuracy",
             (analysis.phase.phases, *_band(analysis.phase.accuracy)),
             dict(xlabel="phase (prefix length N mod M)",
                  title=f"{unit}: prefix probe accuracy per phase (M={sizes[0]})"),
             file=f"{unit}_phases.png", primary_only=True))
  return ProbeResult(fields={"prefix_probe": nested}, figures=figures,
                     matrices={correctness.PREFIX: correctness.Matrix(probe.correct_YxJ,
                                                                      probe.prefixes_J)},
                     primary=Primary("prefix", analysis))


def _gains(trained: trained_lib.TrainedModel, context: ProbeContext, out) -> dict:
  sums = {k: v.sum(axis=0) for k, v in out.items() if k.startswith("pool_")}
  return slot_gain.analyze(trained.params, context.unit_config.model, sums)


def run_slot_gain(context: ProbeContext, rows: int = 64) -> ProbeResult:
  """The ``slot_gain`` entry (module docstring), on ``rows`` held-out rows."""
  trained, unit = context.trained, context.unit
  heldout = trained_lib.heldout_rows(trained.config, rows)
  out = context.predict(heldout)
  gains = _gains(trained, context, out)
  fields, figures = {}, []
  if gains["sites"]:
    fields["slot_gain"] = tuple(SlotGainSite.from_json(site) for site in gains["sites"])
    # C6's null: the same statistic of this config's initialised model on the same rows.
    init = dataclasses.replace(trained, params=slot_gain.init_params(trained))
    init_gains = _gains(init, context, predictor(init, context.batch_size)(heldout))
    fields["slot_gain_init"] = tuple(SlotGainSite.from_json(s) for s in init_gains["sites"])
    figures = [Figure(f"realised slot gain (S'={slots})", "slot_gains", (grid,),
                      dict(title=f"{unit}: realised pooling weight x slots (layers x heads)",
                           value_label="gain (1 = uniform)"),
                      file=f"{unit}_slot_gain_{slots}.png")
               for slots, grid in slot_gain.gain_grids(gains).items()]
  if "ends" in out:
    # No closed chunk gives inf, stored as None (strict JSON).
    fields["heldout_compression_ratio"] = as_float(needle_sweep.compression_ratio(out["ends"]))
  return ProbeResult(fields=fields, figures=tuple(figures))
