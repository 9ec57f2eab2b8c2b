"""One trained variant of a sweep, evaluated: its ``records.variant.VariantRecord``.

The record holds the variant's setup (``describe``: the descriptive schema fields and the
identity fields variant, seed, key_len, value_len, task) and:
- the primary analysis (``stats.analyze``): the needle shift sweep at the far depth for
  retrieval models (``primary_probe`` "needle"), the prefix probe for code models ("prefix");
  ``far_accuracy`` is its mean accuracy;
- ``depths``: the needle sweep at every depth, ``all_depths``: all depths pooled (window starts
  share their phase, see ``needle_sweep``); ``prefix_probe`` (for code prompts with
  ``needle_phases``: accuracy by N mod M and by each needle's own phase); ``slot_gain``;
  ``heldout``: the training run's final held-out metrics;
- language models (task code/corpus, ``sweep.phase_loss_batches > 0``): ``lm_phase_loss``,
  held-out code loss by position mod M per batch and bits per byte, and its ``signature``
  (detrended excess loss per phase, amplitude, permutation p; ``loss_phase``), the per-token
  rows stored in ``DIR/lm_loss/`` (``lm_phase_loss``);
- ``probes``: the results of the probes the sweep config enables (``sweep.probes``, the
  ``probes.registry.PROBES``), each under its own name;
- ``images``: caption -> PNG path, for the report.

Phases: the top-level per-phase fields, ``max_gap`` and ``p_value`` group offsets by
``offset mod M`` for every variant (a positional blind spot, comparable across variants); every
M of the model is in ``by_chunk_size``, and a model without chunks (full attention) is read at
the sweep's reference M first, then at every other M in play. Dynamic models are also read
relative to the chunk the needle actually landed in (``chunk_phase``), and their compression
ratio is measured from the end flags they used, never assumed.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from chunkformer import data as data_lib
from chunkformer import workdir as workdir_lib
from chunkformer.evaluation import stats
from chunkformer.evaluation.probes import (
  lm_phase_loss,
  loaded_model,
  needle_sweep,
  prefix_probe,
  slot_gain,
  split_fields,
)
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.probes.base import ProbeContext
from chunkformer.evaluation.probes.end_flags import end_flags
from chunkformer.evaluation.probes.registry import PROBES
from chunkformer.evaluation.records import correctness, loss_rows
from chunkformer.evaluation.records.variant import (
  SlotGainSite,
  VariantRecord,
  VariantSetup,
  json_ready,
)
from chunkformer.evaluation.report import plots, probe_plots
from chunkformer.evaluation.stats.analysis import DepthAnalysis, PrefixAnalysis, as_float, as_floats
from chunkformer.evaluation.sweep.config import Sweep, Variant, chunk_sizes, unit_variant


def _predictor(trained: trained_lib.TrainedModel, batch_size: int) -> trained_lib.Predictor:
  """Predictions plus the dynamic end flags (``ends``) and the slot-gain sums, per row."""
  model = trained.config.model

  def extract(collections, rows):
    intermediates = collections.get(trained_lib.INTERMEDIATES, {})
    out = slot_gain.extract(intermediates)
    ends = end_flags(model, intermediates)
    if ends is not None:
      out["ends"] = ends.astype(np.int8)
    return out

  predictor = trained_lib.Predictor(trained, batch_size, extract=extract)
  return loaded_model.adapt(trained, predictor)  # kv rows in a loaded model's tokens


def describe(variant: Variant) -> VariantSetup:
  """The variant's descriptive schema fields, read from its resolved config."""
  m = variant.config.model
  layers = m.layers
  compressed = [layer for layer in layers if layer.kind in ("fixed", "dynamic")]
  first = compressed[0] if compressed else m.attention
  if any(layer.kind == "dynamic" for layer in layers):
    attention = "dynamic"
  elif compressed:
    attention = "fixed"
  else:
    attention = "full"  # full or sliding-window layers only: no chunk grid (see layer_kinds)
  chunking = attention
  if attention == "dynamic":
    chunking = f"dynamic/{first.boundary}"
  elif attention == "fixed":
    tags = [t for t, on in (("overlap", first.overlap), (f"stagger-{first.stagger}",
                                                         first.stagger != "none"),
                            ("random-phase", first.random_phase)) if on]
    chunking = "/".join(["fixed"] + tags)
  frozen = variant.config.train.shift_frozen_steps
  if m.key_shift:
    chunking += (f"+{'qk' if m.query_shift else ''}shift{m.key_shift}"
                 + (f"@{frozen}" if frozen else ""))
  data = variant.config.data
  return VariantSetup(
      variant=unit_variant(variant.name), name=variant.name, attention=attention,
      chunking=chunking,
      layer_kinds=tuple(layer.kind for layer in layers),
      chunk_size=first.chunk_size if compressed else None,
      chunk_sizes=tuple(chunk_sizes(m)), rope=bool(m.rope), pooling=first.pooling,
      overlap=bool(compressed and first.overlap),
      compress_window=first.compress_window if compressed else 0,
      window_align=first.compress_window_align if compressed else "end",
      gate=first.gate if compressed else "vector",
      offset_maps=first.offset_maps if compressed else "shared",
      stagger=bool(compressed and first.stagger != "none"),
      stagger_mode=first.stagger if compressed else "none",
      random_phase=bool(compressed and first.random_phase), key_shift=bool(m.key_shift),
      key_shift_width=m.key_shift, key_shift_frozen_steps=frozen, query_shift=m.query_shift,
      window=first.window, task=data.task, key_len=data.key_len, value_len=data.value_len,
      seq_len=data.seq_len,
      seed=variant.config.seed, source=variant.source,
      overrides={k: v if isinstance(v, (int, float, str, bool)) else str(v)
                 for k, v in variant.overrides.items()},
      workdir=variant.workdir)


def _heldout_rows(trained: trained_lib.TrainedModel, count: int) -> dict[str, np.ndarray]:
  config = trained.config
  batches, have, step = [], 0, 0
  while have < count:
    batch = data_lib.make_batch(config.data, seed=config.seed, step=step, split="heldout")
    batches.append(batch)
    have += batch["inputs"].shape[0]
    step += 1
  return {k: np.concatenate([b[k] for b in batches])[:count] for k in batches[0]}


def _phase_sizes(variant: Variant, sweep: Sweep) -> list[int]:
  own = list(chunk_sizes(variant.config.model))
  if own:
    return own
  reference = sweep.settings.reference_chunk_size
  return [reference] + [m for m in sweep.chunk_sizes if m != reference]


def evaluate(trained: trained_lib.TrainedModel, variant: Variant, sweep: Sweep,
             plots_dir: str, correct_path: str | None = None,
             lm_loss_path: str | None = None) -> VariantRecord:
  """The variant's record (module docstring); figures go to ``plots_dir``, the correctness
  matrices behind every statistic to ``correct_path`` (``correctness``) and a language
  model's held-out per-token loss rows to ``lm_loss_path`` (``lm_phase_loss``) when given."""
  settings = sweep.settings
  sizes = _phase_sizes(variant, sweep)
  analyze_kw = dict(seed=settings.seed, num_resamples=settings.num_resamples,
                    num_permutations=settings.num_permutations)
  predictor = _predictor(trained, settings.eval_batch_size)
  setup = describe(variant)
  fields: dict[str, Any] = {}
  matrices: dict[str, correctness.Matrix] = {}
  images: dict[str, str] = {}
  primary = None
  ratio_rows = None

  if variant.config.data.task == "kv":
    depth_results = needle_sweep.run(predictor, needle_sweep.build(variant.config.data,
                                                                   sweep.needle_spec()))
    far = min(depth_results, key=lambda r: r.depth)
    for result in depth_results:
      matrices[correctness.needle_name(result.name)] = correctness.Matrix(
          result.correct_YxJ, result.offsets_J, result.phases_YxJ)
    primary = stats.analyze(far.correct_YxJ, far.offsets_J, sizes, **analyze_kw)
    fields["primary_probe"] = "needle"
    fields["primary_depth"] = far.name
    fields["token_accuracy_by_offset"] = as_floats(far.token_accuracy_YxJ.mean(axis=0))
    fields["depths"] = tuple(
        DepthAnalysis(stats.analyze(result.correct_YxJ, result.offsets_J, sizes,
                                    **analyze_kw).nested(),
                      depth=float(result.depth), depth_name=result.name,
                      mean_distance=float(result.mean_distance),
                      token_accuracy=float(result.token_accuracy_YxJ.mean()),
                      compression_ratio=as_float(result.compression_ratio))
        for result in depth_results)
    pooled = np.concatenate([r.correct_YxJ for r in depth_results])
    fields["all_depths"] = stats.analyze(pooled, far.offsets_J, sizes, **analyze_kw).nested()
    if far.phases_YxJ is not None:
      chunk_phase = stats.analyze(far.correct_YxJ, far.offsets_J, sizes, phases=far.phases_YxJ,
                                  **analyze_kw).phase
      fields["chunk_phase"] = chunk_phase
      images["accuracy per phase inside the actual chunk"] = plots.plot_phase_accuracy(
          os.path.join(plots_dir, f"{variant.name}_chunk_phases.png"), chunk_phase.phases,
          *_band(chunk_phase.accuracy), xlabel="needle phase inside its actual chunk",
          title=f"{variant.name}: accuracy per phase inside the chunk the needle landed in")
    fields["near_accuracy"] = float(max(depth_results, key=lambda r: r.depth).correct_YxJ.mean())
    if split_fields.wants_split_labels(setup):  # C5: accuracy per split label, fixed in advance
      fields["split_labels"] = split_fields.split_fields(
          setup, far.correct_YxJ, far.offsets_J, depth_name=far.name, seed=settings.seed,
          num_resamples=settings.num_resamples)
    ratio_rows = far

  if settings.prefix_prompts:
    probe_rows = prefix_probe.build(variant.config.data, sweep.prefix_spec())
    probe = prefix_probe.run(predictor, probe_rows)
    matrices[correctness.PREFIX] = correctness.Matrix(probe.correct_YxJ, probe.prefixes_J)
    analysis = stats.analyze(probe.correct_YxJ, probe.prefixes_J, sizes, **analyze_kw)
    nested = PrefixAnalysis(
        analysis.nested(), as_floats(probe.token_accuracy_YxJ.mean(axis=0)),
        code_accuracy_by_prefix=(None if probe.code_accuracy_YxJ is None
                                 else as_floats(probe.code_accuracy_YxJ.mean(axis=0))),
        boundary_agreement_by_prefix=(None if probe.boundary_agreement_J is None
                                      else as_floats(probe.boundary_agreement_J)),
        needle_phases=prefix_probe.needle_phases(probe_rows, probe, sizes[0]))
    fields["prefix_probe"] = nested
    extra = {}
    if nested.code_accuracy_by_prefix is not None:
      extra["code byte accuracy"] = nested.code_accuracy_by_prefix
    if nested.boundary_agreement_by_prefix is not None:
      extra["boundary agreement"] = nested.boundary_agreement_by_prefix
    images["prefix probe: accuracy vs prefix length"] = probe_plots.plot_prefix_probe(
        os.path.join(plots_dir, f"{variant.name}_prefix.png"), probe.prefixes_J,
        *_band(analysis.accuracy_by_offset), chunk_size=sizes[0], extra=extra,
        title=f"{variant.name}: prefix probe (p = {analysis.p_value:.3g} at M={sizes[0]})")
    if primary is None:
      primary = analysis
      fields["primary_probe"] = "prefix"

  if primary is None:
    raise ValueError(f"variant {variant.name!r}: a code model needs the prefix probe "
                     "(sweep.prefix_prompts > 0)")
  if fields["primary_probe"] == "needle":
    images = dict(plots.write_analysis_plots(primary, plots_dir, variant.name), **images)
  else:
    images["accuracy per phase of the prefix"] = plots.plot_phase_accuracy(
        os.path.join(plots_dir, f"{variant.name}_phases.png"), primary.phase.phases,
        *_band(primary.phase.accuracy), xlabel="phase (prefix length N mod M)",
        title=f"{variant.name}: prefix probe accuracy per phase (M={sizes[0]})")

  if settings.slot_gain_rows:
    rows = _heldout_rows(trained, settings.slot_gain_rows)
    out = predictor(rows)
    sums = {k: v.sum(axis=0) for k, v in out.items() if k.startswith("pool_")}
    gains = slot_gain.analyze(trained.params, variant.config.model, sums)
    if gains["sites"]:
      fields["slot_gain"] = tuple(SlotGainSite.from_json(site) for site in gains["sites"])
      # C6's null: the same statistic of this config's initialised model on the same rows.
      init = dataclasses.replace(trained, params=slot_gain.init_params(trained))
      init_out = _predictor(init, settings.eval_batch_size)(rows)
      init_gains = slot_gain.analyze(init.params, variant.config.model, {
          k: v.sum(axis=0) for k, v in init_out.items() if k.startswith("pool_")})
      fields["slot_gain_init"] = tuple(SlotGainSite.from_json(s) for s in init_gains["sites"])
      for slots, grid in slot_gain.gain_grids(gains).items():
        images[f"realised slot gain (S'={slots})"] = plots.plot_slot_gains(
            os.path.join(plots_dir, f"{variant.name}_slot_gain_{slots}.png"), grid,
            title=f"{variant.name}: realised pooling weight x slots (layers x heads)",
            value_label="gain (1 = uniform)")
    if "ends" in out:
      # No closed chunk gives inf, stored as None (strict JSON).
      fields["heldout_compression_ratio"] = as_float(needle_sweep.compression_ratio(out["ends"]))

  if settings.phase_loss_batches and variant.config.data.task != "kv":
    phase_loss = lm_phase_loss.measure(trained, settings.phase_loss_batches, sizes[0])
    fields["lm_phase_loss"] = {**phase_loss.as_record(),
                               "signature": phase_loss.rows.signature(sizes[0], **analyze_kw)}
    if lm_loss_path is not None:
      loss_rows.save(lm_loss_path, phase_loss.rows)
  fields["probes"] = run_probes(settings.probes, ProbeContext(
      trained, predictor, variant.name, tuple(sizes), **analyze_kw), matrices) or None
  if correct_path is not None:
    correctness.save(correct_path, matrices)
  return VariantRecord(
      setup=setup, analysis=primary, trained_steps=int(trained.step),
      compression_ratio=_compression_ratio(setup, fields.get("heldout_compression_ratio"),
                                           ratio_rows),
      heldout=_final_metrics(variant.workdir), images=images, **fields)


def run_probes(probes: Mapping[str, Mapping[str, Any]], context: ProbeContext,
               matrices: dict[str, correctness.Matrix]) -> dict[str, Any]:
  """Runs the probes a sweep config enables (``sweep.probes``, ``probes.registry``): their
  records by name; their matrices are added to ``matrices`` as "<name>_<key>"."""
  records = {}
  for name, options in probes.items():
    result = PROBES[name](context, **options)
    records[name] = json_ready(result.record)
    matrices.update({f"{name}_{key}": m for key, m in result.matrices.items()})
  return records


def _band(curve) -> tuple:
  return curve.values, curve.low, curve.high


def _compression_ratio(setup: VariantSetup, measured: float | None, far) -> float | None:
  """Tokens per compressed entry: 1 for full attention, M for fixed, measured for dynamic."""
  if setup.attention == "full":
    return 1.0
  if setup.attention == "fixed":
    return float(setup.chunk_size)
  if measured is None and far is not None:
    measured = far.compression_ratio
  return as_float(measured)


def _final_metrics(workdir: str) -> dict[str, Any] | None:
  path = os.path.join(workdir, workdir_lib.FINAL_METRICS_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f).get("heldout")
