"""The files a finished sweep writes: ``results.json``, ``report.md`` and the plots.

``write(sweep, DIR, records, ...)`` judges the records (verdict lines, seed-pooled tests and
claims C1-C9, all recomputable from DIR: the correctness matrices, stored slot gains and LM
loss rows) and writes ``DIR/results.json`` (``results_file``), ``DIR/report.md`` (comparison
table, claims, verdicts, per-depth / prefix-probe / slot-gain tables, the study's and the
language models' tables) and the figures under ``DIR/plots/``. ``sweep`` decides which records
are current; this module only renders them.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import time
from collections.abc import Mapping, Sequence

import jax

from chunkformer import workdir as workdir_lib
from chunkformer.evaluation import (
  lm_phase_loss,
  lm_tables,
  plots,
  report,
  results_file,
  seed_pooling,
  study_claims,
  study_tables,
  sweep_config,
  verdicts,
)
from chunkformer.evaluation.claims import Claim
from chunkformer.evaluation.variant_record import VariantRecord
from chunkformer.trainer import format_duration

RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"
PLOTS_DIR = "plots"


@dataclasses.dataclass(frozen=True)
class Outcome:
  results_path: str
  report_path: str
  table: str  # the comparison table (markdown, aligned for a console)
  records: list[VariantRecord]
  verdicts: list[str]
  wall_time_s: float
  claims: list[Claim] = dataclasses.field(default_factory=list)


def _intro(sweep: sweep_config.Sweep, command: str, date: str, wall: float) -> str:
  s = sweep.settings
  spec = sweep.needle_spec()
  lines = [
      f"Command: `{command}`" if command else "",
      f"Date: {date}; wall time {format_duration(wall)} ({wall:.0f} s, this invocation); "
      f"seed "
      f"{s.seed}; machine: {platform.machine()}, {os.cpu_count()} CPUs, jax {jax.__version__} "
      f"on {jax.default_backend()}.",
      f"Needle shift sweep: K = {spec.num_offsets} consecutive offsets at depths "
      f"{', '.join(f'{d:g}' for d in spec.depths)} (0 = far), S = {spec.num_haystacks} "
      f"haystacks, window starts aligned to {spec.align} tokens; the table reads the far "
      "depth: 'far acc' counts a needle as retrieved when its whole answer is right, 'far "
      "token acc' is the fraction of answer tokens right, 'held-out far' the training run's "
      "per-token accuracy on held-out rows with needles beyond data.near_distance (the "
      "accuracy gates read it). Prefix probe: "
      + (f"N = 0..{sweep.prefix_spec().max_prefix}, {s.prefix_prompts} prompts."
         if s.prefix_prompts else "off."),
      "",
      "Overrides of every variant: " + (", ".join(
          f"{k}={val}" for k, val in sweep.shared_overrides.items()) or "none") + ".",
      "",
      "| variant | source | its own overrides |",
      "|:--|:--|:--|",
  ]
  for v in sweep.variants:
    own = {k: val for k, val in v.overrides.items()
           if k not in sweep.shared_overrides or sweep.shared_overrides[k] != val}
    lines.append(f"| {v.name} | `{v.source}` | "
                 f"{', '.join(f'{k}={val}' for k, val in own.items()) or '-'} |")
  return "\n".join(lines)


def _extra_sections(records: Sequence[VariantRecord], claims: Sequence[Claim] = (),
                    load: study_claims.Loader | None = None,
                    pooled: Mapping[str, VariantRecord] | None = None) -> str:
  lines = []
  if any(r.depths for r in records):
    lines += ["", "## Needle sweep by depth", "",
              "| variant | depth | distance | accuracy | max gap | periodic share | period | p |",
              "|:--|:--|--:|--:|--:|--:|--:|--:|"]
  for r in records:
    for d in r.depths or ():
      a = d.analysis
      lines.append(f"| {r.name} | {d.depth_name} | {d.mean_distance:.0f} | "
                   f"{a.mean_accuracy.value:.3f} | {a.max_gap:.3f} | {a.periodic_share:.3f} | "
                   f"{a.detected_period or 'none'} | {a.p_value:.3g} |")
  probes = [r for r in records if r.prefix_probe is not None]
  if probes:
    lines += ["", "## Prefix probe (accuracy vs prefix length N, phase N mod M)", "",
              "| variant | N | accuracy | max gap | periodic share | period | p | boundary "
              "agreement (min) |", "|:--|--:|--:|--:|--:|--:|--:|--:|"]
    for r in probes:
      p, a = r.prefix_probe, r.prefix_probe.analysis
      agreement = p.boundary_agreement_by_prefix
      lines.append(f"| {r.name} | 0..{a.offsets[-1]} | {a.mean_accuracy.value:.3f} | "
                   f"{a.max_gap:.3f} | {a.periodic_share:.3f} | "
                   f"{a.detected_period or 'none'} | {a.p_value:.3g} | "
                   f"{'-' if agreement is None else f'{min(agreement):.3f}'} |")
  gains = [r for r in records if r.slot_gain]
  if gains:
    lines += ["", "## Slot gains (preferred phase = weight centre of mass in the chunk)", "",
              "| variant | layer | stream | slots | realised preferred phase per head | "
              "slot-bias preferred phase per head |", "|:--|--:|:--|--:|:--|:--|"]
    for r in gains:
      for site in r.slot_gain:
        def fmt(values):
          return "-" if values is None else ", ".join(
              "-" if v is None else f"{v:.2f}" for v in values)
        lines.append(f"| {r.name} | {site.layer} | {site.stream} | {site.slots} | "
                     f"{fmt(site.preferred_phase)} | {fmt(site.bias_preferred_phase)} |")
  return "\n".join(lines) + "\n" + study_tables.sections(records, claims, load, pooled)


def write(sweep: sweep_config.Sweep, workdir: str, records: list[VariantRecord],
          command: str, began: float, *,
          original: results_file.SweepResults | None = None,
          rejudged_by: str = "") -> Outcome:
  s = sweep.settings
  plots_dir = os.path.join(workdir, PLOTS_DIR)
  # The claims read the correctness matrices (seed-pooled tests, C5) and the stored slot
  # gains (C6): recomputable from DIR alone.
  load = study_claims.loader(workdir)
  pooled = seed_pooling.pooled_records(records, load, seed=s.seed, num_resamples=s.num_resamples,
                                       num_permutations=s.num_permutations)
  lines = verdicts.decide(records, pooled)
  claims = study_claims.claims(records, load, seed=s.seed, num_resamples=s.num_resamples,
                               num_permutations=s.num_permutations, pooled=pooled)
  reference = s.reference_chunk_size
  overview = {"accuracy vs needle offset, all variants (far depth)": plots.plot_variant_comparison(
      os.path.join(plots_dir, "comparison.png"), {r.name: r.analysis for r in records},
      chunk_size=reference, title=f"{s.name}: accuracy per needle offset (bands: M={reference})")}
  wall = time.time() - began
  date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
  intro_note = ""
  if original is not None:  # judged again: the run's own command, date and wall time stand
    intro_note = (f"\n\nJudged again on {date} by `{rejudged_by}` (verdicts, claims, tables "
                  "and plots recomputed from the stored records and correctness matrices; "
                  "no model retrained or re-evaluated).")
    date, wall = original.date, original.wall_time_s
  results = results_file.SweepResults(
      sweep=s.name, command=command, date=date, seed=s.seed, wall_time_s=wall,
      settings=dataclasses.asdict(s), num_offsets=sweep.num_offsets, window_align=sweep.align,
      chunk_sizes_in_play=tuple(sweep.chunk_sizes), verdicts=tuple(lines), report=REPORT_FILE,
      variants=tuple(dataclasses.replace(r, images=relative_images(r.images, workdir))
                     for r in records),
      claims=tuple(claims))
  os.makedirs(workdir, exist_ok=True)
  results_path = results_file.write(os.path.join(workdir, RESULTS_FILE), results)
  report_path = os.path.join(workdir, REPORT_FILE)
  text = report.render_report(records, title=f"Periodicity sweep: {s.name}", verdicts=lines,
                              intro=_intro(sweep, command, date, wall) + intro_note,
                              images=overview, directory=workdir, claims=claims)
  lm = lm_tables.sections(records, lm_phase_loss.loader(workdir), plots_dir, workdir,
                         seed=s.seed, num_resamples=s.num_resamples,
                         num_permutations=s.num_permutations)
  workdir_lib.write_text(report_path, text + _extra_sections(records, claims, load, pooled) + lm)
  return Outcome(results_path, report_path, report.comparison_table(records), records, lines,
                 wall, claims)


def relative_images(images: Mapping[str, str], workdir: str) -> dict[str, str]:
  return {k: os.path.relpath(v, workdir) for k, v in images.items()}
