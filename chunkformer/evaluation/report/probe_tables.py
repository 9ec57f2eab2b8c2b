"""Report tables of the probes' record fields: the needle sweep by depth, the prefix probe, the
slot gains and the registry probes the sweep enabled, one row per record (formatting only)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.report import sections as study_sections


def sections(records: Sequence[VariantRecord]) -> str:
  """The per-depth, prefix-probe and slot-gain tables (empty where no record has them)."""
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
      agreement = p.worst_boundary_agreement
      lines.append(f"| {r.name} | 0..{a.offsets[-1]} | {a.mean_accuracy.value:.3f} | "
                   f"{a.max_gap:.3f} | {a.periodic_share:.3f} | "
                   f"{a.detected_period or 'none'} | {a.p_value:.3g} | "
                   f"{'-' if agreement is None else f'{agreement:.3f}'} |")
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
  return "\n".join(lines + registry_table(records)) + "\n"


def registry_table(records: Sequence[VariantRecord]) -> list[str]:
  """The studies' own probe sections (``sections.ReportHooks.probe_sections``), then one row per
  unit and other registry probe: its stored result (empty when no probe ran)."""
  lines = []
  for hooks in study_sections.HOOKS.values():
    own = hooks.probe_sections(records) if hooks.probe_sections else ""
    lines += own.split("\n") if own else []
  skip = study_sections.own_probes()
  found = [(r.name, name, value) for r in records for name, value in (r.probes or {}).items()
           if value is not None and name not in skip]
  if not found:
    return lines
  lines += ["", "## Probes enabled by the sweep config", "",
           "Each probe's result as the unit's record stores it (results.json "
           "``variants[i].probes``).", "", "| unit | probe | result |", "|:--|:--|:--|"]
  return lines + [f"| {unit} | {name} | `{json.dumps(value, sort_keys=True)}` |"
                  for unit, name, value in found]
