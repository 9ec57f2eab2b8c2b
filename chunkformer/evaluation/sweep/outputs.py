"""The files a finished sweep writes: ``results.json``, ``report.md`` and the plots.

``write(sweep, DIR, records, ...)`` has the records judged (``claims.judge``: verdict lines,
seed-pooled tests, the studies' claims and their tables' statistics, all recomputable from DIR:
the correctness matrices, stored slot gains and LM loss rows) and writes ``DIR/results.json``
(``results_file``), ``DIR/report.md`` (``report``: comparison table, claims, verdicts, the
probes' tables and each study's sections) and the figures under ``DIR/plots/``. ``run``
decides which records are current.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import time
from collections.abc import Mapping
from typing import Any

import jax

from chunkformer import provenance
from chunkformer import workdir as workdir_lib
from chunkformer.config import ConfigError
from chunkformer.evaluation.claims import judging
from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.records import correctness, loss_rows, results_file
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.report import markdown, plots, probe_tables
from chunkformer.evaluation.report import sections as study_sections
from chunkformer.evaluation.sweep import config as sweep_config
from chunkformer.evaluation.sweep import probe_settings
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
      (f"Needle shift sweep: K = {spec.num_offsets} consecutive offsets at depths "
       f"{', '.join(f'{d:g}' for d in spec.depths)} (0 = far), S = {spec.num_haystacks} "
       f"haystacks, window starts aligned to {spec.align} tokens; the table reads the far "
       "depth: 'far acc' counts a needle as retrieved when its whole answer is right, 'far "
       "token acc' is the fraction of answer tokens right, 'held-out far' the training run's "
       "per-token accuracy on held-out rows with needles beyond data.near_distance (the "
       "accuracy gates read it)." if sweep.runs("needle_sweep") else "Needle shift sweep: off.")
      + " Prefix probe: "
      + (f"N = 0..{sweep.prefix_spec().max_prefix}, {sweep.prefix_spec().num_prompts} prompts."
         if sweep.runs("prefix_probe") else "off."),
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


def write(sweep: sweep_config.Sweep, workdir: str, records: list[VariantRecord],
          command: str, began: float, *,
          original: results_file.SweepResults | None = None,
          rejudged_by: str = "") -> Outcome:
  s = sweep.settings
  plots_dir = os.path.join(workdir, PLOTS_DIR)
  # Judged from DIR alone: the records, the correctness matrices (seed-pooled tests, C5) and
  # the stored slot gains (C6) and loss rows.
  plan = (provenance.file_state(sweep_config.plan_path(s.plan)) if s.plan and
          sweep_config.plan_path(s.plan) else None)
  settings = _settings(sweep, original, workdir)
  judged = judging.judge(records, correctness.loader(workdir),
                         loss_rows=loss_rows.loader(workdir), seed=s.seed,
                         num_resamples=s.num_resamples, num_permutations=s.num_permutations,
                         plan=plan, rules=claim_rules.of_settings(settings).version)
  lines, claims = list(judged.verdicts), list(judged.claims)
  reference = s.reference_chunk_size
  views = study_sections.views(records, claims, judged.tables, plots_dir, workdir)
  overview = {}
  for study, hooks in study_sections.HOOKS.items():
    if hooks.overview:
      overview.update(hooks.overview(views[study]))
  overview["accuracy vs needle offset, all variants (far depth)"] = plots.plot_variant_comparison(
      os.path.join(plots_dir, "comparison.png"), {r.name: r.analysis for r in records},
      chunk_size=reference, title=f"{s.name}: accuracy per needle offset (bands: M={reference})")
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
      settings=settings, num_offsets=sweep.num_offsets, window_align=sweep.align,
      chunk_sizes_in_play=tuple(sweep.chunk_sizes), verdicts=tuple(lines), report=REPORT_FILE,
      variants=tuple(dataclasses.replace(r, images=relative_images(r.images, workdir))
                     for r in records),
      claims=tuple(claims), current_rules=claim_rules.CURRENT if judged.current else "",
      current_claims=judged.current)
  os.makedirs(workdir, exist_ok=True)
  results_path = results_file.write(os.path.join(workdir, RESULTS_FILE), results)
  report_path = os.path.join(workdir, REPORT_FILE)
  text = markdown.render_report(records, title=f"Periodicity sweep: {s.name}", verdicts=lines,
                              intro=_intro(sweep, command, date, wall) + intro_note,
                              images=overview, directory=workdir, claims=claims,
                              rules=_rules_change(judged),
                              summary=_summary(s, plan, views), regime=_regime(views))
  studies = "".join(hooks.sections(views[study]) for study, hooks in study_sections.HOOKS.items()
                    if hooks.sections)
  workdir_lib.write_text(report_path, text + probe_tables.sections(records) + studies)
  return Outcome(results_path, report_path, markdown.comparison_table(records), records, lines,
                 wall, claims)


def _summary(settings: sweep_config.SweepSettings, plan: Mapping[str, Any] | None,
             views: Mapping[str, study_sections.View]) -> list[str]:
  """The summary's lines after the claims: the plan, then what each study adds (the paper
  study: its main table and the comparison with the paper's published numbers)."""
  lines = []
  if settings.plan:
    lines.append(
        f"Pre-registered plan: `{settings.plan}`, "
        + ("missing" if plan is None else
           f"sha256 {plan['sha256'][:16]}, last committed in "
           f"{plan['commit'][:10] or '(never committed)'}"
           + ("" if plan["committed"] else ", with uncommitted changes"))
        + "; verdict lines of units trained under another plan, or none, say PLAN.")
  for study, hooks in study_sections.HOOKS.items():
    added = hooks.summary(views[study]) if hooks.summary else []
    if added:
      lines += ([""] if lines else []) + added
  return lines


def _regime(views: Mapping[str, study_sections.View]) -> list[str]:
  """The report's first lines: each study's account of what its models are (``regime``)."""
  return [line for study, hooks in study_sections.HOOKS.items() if hooks.regime
          for line in hooks.regime(views[study])]


def _rules_change(judged: judging.Judged) -> markdown.RulesChange | None:
  """What the report says about the claim rules when older ones decide (else None)."""
  if not judged.current:
    return None
  now = claim_rules.CURRENT_RULES
  return markdown.RulesChange(
      judged.rules.version, judged.rules.written, now.version, now.written,
      claim_rules.changes_since(judged.rules.version), judged.current)


def _settings(sweep: sweep_config.Sweep, original: results_file.SweepResults | None,
              workdir: str) -> dict[str, Any]:
  """The sweep's settings; a sweep judged again keeps those it stored where they are the same
  settings (older files write the built-in probes as flat fields). The claim rules are those
  the directory's results.json first recorded (none recorded: version 1, ``claims.rules``),
  so units added to a judged sweep, or a rejudge, leave its verdicts decided by the rules its
  first results were judged under; a new directory takes the config's (the current ones)."""
  settings = sweep.settings.to_json()
  path = os.path.join(workdir, RESULTS_FILE)
  if original is None and os.path.exists(path):
    original = results_file.load(path)
  if original is None:
    return settings
  stored = dict(original.settings)
  try:
    same = (probe_settings.comparable(_without_rules(stored))
            == probe_settings.comparable(_without_rules(settings)))
  except ConfigError:  # stored by code with other probes
    same = False
  return stored if same else dict(settings, rules=claim_rules.of_settings(stored).version)


def _without_rules(settings: Mapping[str, Any]) -> dict[str, Any]:
  return {k: v for k, v in settings.items() if k != "rules"}


def relative_images(images: Mapping[str, str], workdir: str) -> dict[str, str]:
  return {k: os.path.relpath(v, workdir) for k, v in images.items()}
