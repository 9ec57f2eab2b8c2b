"""One trained variant of a sweep, evaluated: its ``records.variant.VariantRecord``.

``evaluate`` runs the probes the sweep config enables (``sweep.probes``, in the order of
``probes.registry.PROBES``) on the unit and assembles the record:
- its setup (``describe``: the descriptive schema fields and the identity fields variant,
  seed, key_len, value_len, task) and the training run's final held-out metrics (``heldout``);
- the typed fields the built-in probes give (``probes.instruments``: the needle sweep, prefix
  probe, slot gains, loss by position), where the claims read them;
- the primary analysis: the first one a probe offers (the needle sweep's far depth for
  retrieval models, "needle"; the prefix probe's for code models, "prefix");
  ``far_accuracy`` is its mean accuracy;
- ``probes``: every other probe's record, under its name;
- ``images``: caption -> PNG path of the figures the probes describe, for the report.
The correctness matrices go to ``DIR/correct/<unit>.npz``, a language model's per-token loss
rows to ``DIR/lm_loss/<unit>.npz``.

Phases: the top-level per-phase fields, ``max_gap`` and ``p_value`` group offsets by
``offset mod M`` for every variant (a positional blind spot, comparable across variants); every
M of the model is in ``by_chunk_size``, and a model without chunks (full attention) is read at
the sweep's reference M first, then at every other M in play. Dynamic models are also read
relative to the chunk the needle actually landed in (``chunk_phase``), and their compression
ratio is measured from the end flags they used, never assumed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from chunkformer import workdir as workdir_lib
from chunkformer.evaluation.probes import instruments
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.probes.base import Primary, ProbeContext, ProbeResult
from chunkformer.evaluation.probes.registry import PROBES, enabled
from chunkformer.evaluation.records import correctness, loss_rows
from chunkformer.evaluation.records.variant import VariantRecord, VariantSetup, json_ready
from chunkformer.evaluation.report import figures
from chunkformer.evaluation.stats.analysis_types import as_float
from chunkformer.evaluation.sweep.config import Sweep, Variant, chunk_sizes, unit_variant


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
      num_kv_heads=m.num_kv_heads,
      window=first.window, task=data.task, key_len=data.key_len, value_len=data.value_len,
      seq_len=data.seq_len,
      seed=variant.config.seed, source=variant.source,
      overrides={k: v if isinstance(v, (int, float, str, bool)) else str(v)
                 for k, v in variant.overrides.items()},
      workdir=variant.workdir)


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
  setup = describe(variant)
  context = ProbeContext(
      trained, instruments.predictor(trained, settings.eval_batch_size), variant.name,
      tuple(_phase_sizes(variant, sweep)), seed=settings.seed,
      num_resamples=settings.num_resamples, num_permutations=settings.num_permutations,
      config=variant.config, setup=setup, sweep_chunk_sizes=sweep.chunk_sizes,
      batch_size=settings.eval_batch_size)
  fields: dict[str, Any] = {}
  records: dict[str, Any] = {}
  matrices: dict[str, correctness.Matrix] = {}
  images: dict[str, str] = {}
  primary: Primary | None = None
  for name in enabled(settings.probes):
    result = PROBES[name](context, **settings.probes[name])
    gives_primary = primary is None and result.primary is not None
    primary = result.primary if gives_primary else primary
    images.update(figures.draw([f for f in result.figures if gives_primary or not f.primary_only],
                               plots_dir))
    _store(name, result, fields, records, matrices)
    if result.loss_rows is not None and lm_loss_path is not None:
      loss_rows.save(lm_loss_path, result.loss_rows)
  if primary is None:  # resolve refuses such a sweep; a probe may still decline a unit
    raise ValueError(f"variant {variant.name!r}: no probe gave a primary analysis (a retrieval "
                     "model needs sweep.probes.needle_sweep or prefix_probe, others "
                     "sweep.probes.prefix_probe)")
  if correct_path is not None:
    correctness.save(correct_path, matrices)
  return VariantRecord(
      setup=setup, analysis=primary.analysis, primary_probe=primary.probe,
      trained_steps=int(trained.step),
      compression_ratio=_compression_ratio(setup, fields.get("heldout_compression_ratio"),
                                           fields),
      heldout=_final_metrics(variant.workdir), images=images, probes=records or None, **fields)


_RECORD_FIELDS = frozenset(f.name for f in dataclasses.fields(VariantRecord))


def _store(name: str, result: ProbeResult, fields: dict[str, Any], records: dict[str, Any],
           matrices: dict[str, correctness.Matrix]) -> None:
  """A built-in's typed fields (its matrices under their own names), or any other probe's
  record under its name (its matrices as "<name>_<key>")."""
  if result.fields is None:
    records[name] = json_ready(result.record)
    matrices.update({f"{name}_{key}": m for key, m in result.matrices.items()})
    return
  unknown = set(result.fields) - _RECORD_FIELDS
  if unknown:
    raise ValueError(f"probe {name!r}: fields {sorted(unknown)} are not VariantRecord fields")
  fields.update(result.fields)
  matrices.update(result.matrices)


def _compression_ratio(setup: VariantSetup, measured: float | None,
                       fields: dict[str, Any]) -> float | None:
  """Tokens per compressed entry: 1 for full attention, M for fixed, measured for dynamic (on
  the slot-gain rows, else on the far depth's needle rows)."""
  if setup.attention == "full":
    return 1.0
  if setup.attention == "fixed":
    return float(setup.chunk_size)
  if measured is None:
    far = [d for d in fields.get("depths") or () if d.depth_name == fields.get("primary_depth")]
    measured = far[0].compression_ratio if far else None
  return as_float(measured)


def _final_metrics(workdir: str) -> dict[str, Any] | None:
  return (workdir_lib.read_final_metrics(workdir) or {}).get("heldout")
