"""Sweep orchestration: train each variant that is missing and evaluate it, write the results.

``run(config, DIR)`` with a sweep config (``config``):
1. resolves and checks every variant (ConfigError before anything is trained or written);
2. takes each variant in turn: trains it when it has no finished run in ``DIR/<variant>/``
   with the training library (which resumes an interrupted run), showing the variant, step
   and ETA, then evaluates it unless its stored record is current (``unit``: the probes
   ``sweep.probes`` enables; by default the needle shift sweep, prefix probe and slot gains),
   storing its record in ``DIR/records/<variant>.json``, its correctness matrices in
   ``DIR/correct/<variant>.npz`` and, for language models, its held-out per-token loss rows
   in ``DIR/lm_loss/<variant>.npz`` (a stopped sweep keeps the records of the variants it
   finished);
3. writes (``outputs``) ``DIR/results.json`` (the records, verdict lines and claims),
   ``DIR/report.md`` with the comparison table, claims, verdicts and figures, and the figures
   under ``DIR/plots/``.
With a shard (``shards``: ``--shard i/n``) step 2 covers that shard's variants and step 3
waits until every variant has a current record (or ``merge``).

A variant counts as finished when ``DIR/<variant>/final_metrics.json`` records its last step
under the same config; it is then not retrained.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Mapping, Sequence

import ml_collections
from absl import logging

from chunkformer import provenance, run_lock, trainer
from chunkformer import workdir as workdir_lib
from chunkformer.config import ConfigError
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.records import correctness, loss_rows, reading, results_file
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.sweep import config as sweep_config
from chunkformer.evaluation.sweep import outputs, probe_settings, shards, unit
from chunkformer.evaluation.sweep.outputs import PLOTS_DIR, RESULTS_FILE, Outcome

TRAIN_TIME_FILE = "sweep_train_time.json"
RECORDS_DIR = "records"  # one results.json entry per variant, for merging shards


class Interrupted(RuntimeError):
  """Training of a variant stopped early (preemption); rerunning the command resumes it."""


def is_finished(variant: sweep_config.Variant) -> bool:
  """Whether ``variant.workdir`` holds this variant's finished run (final metrics written)."""
  if not variant.train:
    return True
  diff = workdir_lib.recorded_differences(variant.workdir, variant.config)
  if diff is None or workdir_lib.blocking(diff):
    return False
  final = workdir_lib.read_final_metrics(variant.workdir)
  return final is not None and final.get("step") == variant.config.train.steps


class ProgressDisplay:
  """Progress lines: which variant trains, its step, and ETAs for it and all training left."""

  def __init__(self, name: str, to_train: Sequence[sweep_config.Variant]):
    self.name = name
    self.steps = [v.config.train.steps for v in to_train]
    self.names = [v.name for v in to_train]
    self.index = -1

  def start(self, variant: sweep_config.Variant) -> None:
    self.index = self.names.index(variant.name)
    logging.info("[sweep %s] training %d/%d %r (%d steps) in %s", self.name, self.index + 1,
                 len(self.names), variant.name, variant.config.train.steps, variant.workdir)

  def __call__(self, progress: trainer.Progress) -> None:
    if progress.split != "train":
      return
    later = sum(self.steps[self.index + 1:])
    rate = progress.steps_per_sec
    # Later variants are assumed to train at this variant's rate: a rough, honest guess.
    total = progress.eta_s + (later / rate if rate > 0 else math.inf)
    logging.info("[sweep %s] training %d/%d %r: step %d/%d (%d%%), %.1f steps/s, ETA %s for "
                 "this variant, ~%s for all training left", self.name, self.index + 1,
                 len(self.names), self.names[self.index], progress.step, progress.total_steps,
                 100 * progress.step // max(progress.total_steps, 1), rate,
                 trainer.format_duration(progress.eta_s), trainer.format_duration(total))


def _train_time(variant: sweep_config.Variant, add: float = 0.0) -> float | None:
  """Training wall time spent by sweeps on this variant, accumulated over resumes."""
  path = os.path.join(variant.workdir, TRAIN_TIME_FILE)
  spent = None
  if os.path.exists(path):
    with open(path) as f:
      spent = json.load(f).get("wall_s")
  if add:
    spent = (spent or 0.0) + add
    workdir_lib.write_json(variant.workdir, TRAIN_TIME_FILE, {"wall_s": spent})
  return spent


PLAN_FILE = "plan.json"  # in a unit's run directory: the plans it trained under


def record_plan(run_dir: str, plan: str) -> list[dict]:
  """Appends the plan file's state (``provenance.file_state``) to ``run_dir/plan.json`` when
  it differs from the last one recorded (a run resumed under a changed plan keeps both)."""
  state = dict(provenance.file_state(sweep_config.plan_path(plan)), name=plan,
               date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
  trained = read_plans(run_dir) or []
  last = trained[-1] if trained else {}
  if (last.get("sha256"), last.get("committed")) != (state["sha256"], state["committed"]):
    trained.append(state)
    os.makedirs(run_dir, exist_ok=True)
    workdir_lib.write_json(run_dir, PLAN_FILE, {"trained_under": trained})
  return trained


def read_plans(run_dir: str) -> list[dict] | None:
  """The plans a unit trained under (None: no plan recorded)."""
  path = os.path.join(run_dir, PLAN_FILE)
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    return list(json.load(f)["trained_under"])


@dataclasses.dataclass(frozen=True)
class PartOutcome:
  """A shard's part is done but other parts are missing: nothing merged yet."""

  shard: shards.Shard
  evaluated: list[str]  # variants evaluated by this call (not those whose record was reused)
  missing: list[str]  # variants without a current record (other shards still to run)


def _unit_lock(variant: sweep_config.Variant, workdir: str) -> str:
  """The lock of one unit (``run_lock``): its run directory if the sweep trains it (training
  takes the same lock), else a file beside its record."""
  if variant.train:
    return run_lock.directory_lock(variant.workdir)
  return run_lock.output_lock(record_path(workdir, variant.name))


def _each_unit(sweep: sweep_config.Sweep, variants: Sequence[sweep_config.Variant],
               purpose: str, work) -> None:
  """``work(variant)`` under each unit's lock; a unit another shard holds is done last, after
  waiting for it (``run_lock.each_exclusive``)."""
  run_lock.each_exclusive(variants, lambda v: _unit_lock(v, sweep.workdir), purpose, work,
                          name=lambda v: f"sweep unit {v.name!r}")


def _trainer(sweep: sweep_config.Sweep, variants: Sequence[sweep_config.Variant]):
  """The per-unit training of ``variants`` (a unit with a finished run, maybe trained by
  another shard meanwhile, is left as it is)."""
  s = sweep.settings
  display = ProgressDisplay(s.name, [v for v in variants if v.train and not is_finished(v)])

  def train(variant: sweep_config.Variant) -> None:
    if variant.name not in display.names or is_finished(variant):  # maybe by another shard
      logging.info("[sweep %s] %r: finished run in %s, not retrained", s.name, variant.name,
                   variant.workdir)
      return
    display.start(variant)
    if s.plan:
      record_plan(variant.workdir, s.plan)
    start = time.time()
    final = trainer.train(variant.config, variant.workdir, progress=display)
    _train_time(variant, time.time() - start)
    if final.get("preempted"):
      raise Interrupted(f"sweep variant {variant.name!r} stopped at step {final['step']} "
                        "(preempted, checkpoint saved); rerun the same command to resume")

  return train


def _train(sweep: sweep_config.Sweep, variants: Sequence[sweep_config.Variant]) -> None:
  """Trains every unit of ``variants`` that has no finished run."""
  _each_unit(sweep, [v for v in variants if v.train], "sweep training", _trainer(sweep, variants))


def record_path(workdir: str, variant: str) -> str:
  return os.path.join(workdir, RECORDS_DIR, f"{variant}.json")


def _evaluator(sweep: sweep_config.Sweep, variants: Sequence[sweep_config.Variant],
               workdir: str, records: list[VariantRecord]):
  """The per-unit evaluation of ``variants``: each record is appended to ``records`` and
  stored (``record_path``) for a merge. A unit another shard evaluated while this one waited
  for it is not evaluated again (nor appended)."""
  def evaluate(variant: sweep_config.Variant) -> None:
    if stored_record(sweep, variant, workdir)[0] is not None:
      logging.info("[sweep %s] %r: evaluated by another process meanwhile", sweep.settings.name,
                   variant.name)
      return
    i = variants.index(variant)
    logging.info("[sweep %s] evaluating %d/%d %r", sweep.settings.name, i + 1, len(variants),
                 variant.name)
    start = time.time()
    record = unit.evaluate(trained_lib.load(variant.workdir), variant, sweep,
                           os.path.join(workdir, PLOTS_DIR),
                           correctness.path_for(workdir, variant.name),
                           loss_rows.path_for(workdir, variant.name))
    plans = read_plans(variant.workdir)
    record = dataclasses.replace(record, eval_wall_s=time.time() - start,
                                 train_wall_s=_train_time(variant),
                                 plan=None if plans is None else tuple(plans))
    path = record_path(workdir, variant.name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    images = outputs.relative_images(record.images, workdir)
    stored = dataclasses.replace(record, images=images).to_json()
    settings = json.loads(json.dumps(sweep.settings.to_json()))  # compared by _record_settings
    workdir_lib.write_text(path, json.dumps({"sweep_settings": settings, "record": stored},
                                          indent=1) + "\n")
    records.append(record)

  return evaluate


def _evaluate(sweep: sweep_config.Sweep, variants: Sequence[sweep_config.Variant],
              workdir: str) -> list[VariantRecord]:
  """Evaluates ``variants`` (``_evaluator``); returns the records made."""
  records: list[VariantRecord] = []
  _each_unit(sweep, variants, "sweep evaluation", _evaluator(sweep, variants, workdir, records))
  return records


def _train_and_evaluate(sweep: sweep_config.Sweep, variants: Sequence[sweep_config.Variant],
                        workdir: str, merged: Mapping[str, dict]) -> list[VariantRecord]:
  """Each unit in turn: trained when it has no finished run, then evaluated unless its stored
  record is current (same settings, config and finished run; in DIR/records/ or
  DIR/results.json), so a stopped sweep keeps every record of a unit it finished and resumes
  both; returns the records made. Move DIR/records/ and DIR/results.json away to evaluate every
  unit afresh."""
  records: list[VariantRecord] = []
  train = _trainer(sweep, variants)
  evaluate = _evaluator(sweep, variants, workdir, records)

  def both(variant: sweep_config.Variant) -> None:
    if variant.train:
      train(variant)
    if stored_record(sweep, variant, workdir, merged)[0] is not None:
      logging.info("[sweep %s] %r: stored record is current, not evaluated again",
                   sweep.settings.name, variant.name)
      return
    evaluate(variant)

  _each_unit(sweep, variants, "sweep unit", both)
  return records


def _record_settings(settings: Mapping) -> dict:
  """The settings a record depends on, as JSON with every probe's full options
  (``probe_settings.comparable``, either form): all but the variant order (it changes none)."""
  try:
    comparable = probe_settings.comparable(settings)
  except ConfigError:  # stored by code with other probes: compared as written, so stale
    comparable = json.loads(json.dumps(dict(settings)))
  # The variant order changes no record; the plan and the claim rules are judged, not measured.
  return {k: v for k, v in comparable.items() if k not in ("order", "plan", "rules")}


def merged_entries(workdir: str) -> dict[str, dict]:
  """The records of ``DIR/results.json`` in the form ``record_path`` stores them.

  A committed sweep keeps its results.json but no ``records/``; with these its variants count
  as evaluated, so units added to its config train and merge in place.
  """
  path = os.path.join(workdir, RESULTS_FILE)
  if not os.path.exists(path):
    return {}
  results = reading.json_object(path, results_file.WHAT, ("variants",))
  settings = results.get("settings") or {}
  return {entry["name"]: {"sweep_settings": settings, "record": entry}
          for entry in results.get("variants", [])}


def stored_record(sweep: sweep_config.Sweep, variant: sweep_config.Variant, workdir: str,
                  merged: Mapping[str, dict] | None = None) -> tuple[VariantRecord | None, str]:
  """The variant's stored record if it is current, else (None, why not).

  ``merged`` (``merged_entries``) is consulted when ``DIR/records/`` has no file for it.
  """
  path = record_path(workdir, variant.name)
  if os.path.exists(path):
    stored = reading.json_object(path, "a unit's sweep record", ("sweep_settings", "record"))
  elif merged and variant.name in merged:
    stored = merged[variant.name]
  else:
    return None, "not evaluated"
  settings = _record_settings(sweep.settings.to_json())
  before = _record_settings(stored["sweep_settings"])
  changed = sorted(k for k in settings.keys() | before.keys() if before.get(k) != settings.get(k))
  if changed:
    return None, f"evaluated under other sweep settings: {', '.join(changed)}"
  record = VariantRecord.from_json(stored["record"])
  # Its variant directory may have moved with DIR (shards merged from other machines).
  setup = dataclasses.replace(record.setup, workdir=variant.workdir)
  if setup != unit.describe(variant) or not is_finished(variant):
    return None, "evaluated under a different config"
  images = {k: os.path.join(workdir, v) for k, v in record.images.items()}
  return dataclasses.replace(record, setup=setup, images=images), ""


def run(config: ml_collections.ConfigDict, workdir: str, *, command: str = "",
        shard: shards.Shard | None = None) -> Outcome | PartOutcome:
  """Runs the sweep of ``config`` in ``workdir`` (module docstring); returns what it wrote.

  With ``shard``, only that shard's variants are trained and evaluated (``shards``); the
  results are merged when every variant then has a current record, else a ``PartOutcome``.
  """
  began = time.time()
  workdir_lib.require_directory(workdir)  # before any variant trains
  sweep = sweep_config.resolve(config, workdir)
  mine = sweep.variants
  if shard is not None:
    shards.check_count(shard, len(sweep.variants))
    mine = shard.select(sweep.variants)
    logging.info("[sweep %s] shard %s: variants %s", sweep.settings.name, shard,
                 ", ".join(v.name for v in mine))
  merged = merged_entries(workdir)
  fresh = _train_and_evaluate(sweep, mine, workdir, merged)
  evaluated = {r.name: r for r in fresh}
  # The rest: a stored record that was current, or one another shard wrote while we waited.
  for variant in (v for v in mine if v.name not in evaluated):
    if (record := stored_record(sweep, variant, workdir, merged)[0]) is not None:
      evaluated[variant.name] = record
  if shard is not None:
    others = {v.name: stored_record(sweep, v, workdir, merged) for v in sweep.variants
              if v.name not in evaluated}
    missing = [name for name, (record, _) in others.items() if record is None]
    if missing:
      logging.info("[sweep %s] shard %s done; waiting for %s (then: --merge)",
                   sweep.settings.name, shard, ", ".join(missing))
      return PartOutcome(shard, [r.name for r in fresh], missing)
    evaluated.update({name: record for name, (record, _) in others.items()})
  with _report_lock(workdir):
    return outputs.write(sweep, workdir, [evaluated[v.name] for v in sweep.variants], command,
                         began)


def _report_lock(workdir: str):
  """Shards finishing together write results.json, report.md and plots/ one after the other."""
  return run_lock.hold(run_lock.directory_lock(workdir), "sweep report", wait=True,
                       what=f"sweep {workdir!r}")


def merge(config: ml_collections.ConfigDict, workdir: str, *, command: str = "") -> Outcome:
  """Writes results.json, the report and plots from the stored records of every variant."""
  began = time.time()
  workdir_lib.require_directory(workdir)
  sweep = sweep_config.resolve(config, workdir)
  merged = merged_entries(workdir)
  found = {v.name: stored_record(sweep, v, workdir, merged) for v in sweep.variants}
  missing = [f"{name} ({why})" for name, (record, why) in found.items() if record is None]
  if missing:
    raise ConfigError(f"--merge: no current record in {workdir} for {', '.join(missing)}; run "
                      "their shards first (eval.py --config ... --shard i/n)")
  with _report_lock(workdir):
    return outputs.write(sweep, workdir, [found[v.name][0] for v in sweep.variants], command,
                         began)


def rejudge(config: ml_collections.ConfigDict, workdir: str, *, command: str = "") -> Outcome:
  """Judges a finished sweep again: results.json, report.md and plots rewritten from the
  records stored in ``DIR/results.json`` (and the correctness matrices) by today's verdict,
  claim and report code, without training or evaluating anything. The original command, date
  and wall time are kept; the report says when and by which command it was judged again.
  """
  began = time.time()
  workdir_lib.require_directory(workdir)
  sweep = sweep_config.resolve(config, workdir)
  path = os.path.join(workdir, RESULTS_FILE)
  if not os.path.exists(path):
    raise ConfigError(f"--rejudge: {path} does not exist; run the sweep first")
  stored = results_file.load(path)
  by_name = {r.name: r for r in stored.variants}
  missing = [v.name for v in sweep.variants if v.name not in by_name]
  if missing:
    raise ConfigError(f"--rejudge: {path} has no record of {', '.join(missing)} (variants of "
                      "the sweep config); judge the sweep it was written by")
  records = [dataclasses.replace(by_name[v.name], images={
      k: os.path.join(workdir, x) for k, x in by_name[v.name].images.items()})
      for v in sweep.variants]
  return outputs.write(sweep, workdir, records, stored.command, began, original=stored,
                        rejudged_by=command)


