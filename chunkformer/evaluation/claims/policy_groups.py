"""What claims on a sweep under an inference-time setting read: each setting's correctness
matrices per trained model, grouped over seeds.

A probe of ``probes.policy_needles`` stores, per unit, one record per setting (``probes
.<probe>[<label>]``: the setting's config dict under the study's ``field``, the study's own
fields, per depth the accuracies and the name of its matrix) and the matrices themselves
(``DIR/correct/<unit>.npz`` as ``<probe>_<key>``). ``collect`` turns them into ``Group``s:
one setting at one depth on one model variant, with one ``Run`` per training seed, the
setting parsed by the study (``Reading``). A group's seed-pooled matrix stacks its seeds'
haystack rows (``stats.seed_rule.pool_seeds``) unless claim rules say how to pool. A group's
``PhaseRow`` (``phase_rows``) is what a report's phase table shows of it: accuracy pooled over
seeds and, per length L, the accuracy by residue of the needle offset mod L with Wilson
intervals; a study adds its own columns by subclassing it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.claims import standards
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.stats.residue_accuracy import ResidueAccuracy, summarize
from chunkformer.evaluation.stats.seed_rule import pool_seeds

PLAIN = "needle"  # the plain needle sweep's matrices (no setting applied): ``needle_<depth>``


@dataclasses.dataclass(frozen=True)
class Reading:
  """How a study's records are read: its probe, the record field that holds a setting's
  config dict, how that dict is parsed (``parse(spec, where)``, ``where`` naming the record
  for errors), and how a label is shown in group names."""

  probe: str
  field: str
  parse: Callable[[Mapping[str, Any], str], Any]
  shown: Callable[[str], str] = str


@dataclasses.dataclass(frozen=True)
class Run:
  """One setting at one depth on one trained model (one seed)."""

  unit: str
  seed: int
  matrix: correctness.Matrix | None  # None: not stored
  plain: correctness.Matrix | None  # the plain needle sweep's matrix at this depth
  gate: float | None  # the model's held-out far accuracy with no setting applied


def stack(found: Sequence[correctness.Matrix | None],
          rules: claim_rules.Rules | None = None) -> correctness.Matrix | None:
  """The seeds' matrices pooled as the claim rules say (default: their haystack rows
  stacked); None when a matrix is missing or their offsets differ."""
  if not found or any(m is None for m in found) or any(
      not np.array_equal(m.offsets_J, found[0].offsets_J) for m in found):
    return None
  if len(found) == 1:
    return found[0]
  rows = [m.correct_YxJ for m in found]
  return correctness.Matrix(pool_seeds(rows) if rules is None else rules.pool(rows),
                            found[0].offsets_J)


@dataclasses.dataclass(frozen=True)
class Group:
  """One setting (``label``, parsed: ``setting``) at one depth on one model variant, over
  its seeds."""

  variant: str
  label: str
  setting: Any  # the policy or pattern, parsed from the first unit's record
  depth: str
  runs: tuple[Run, ...]  # in seed order
  entries: tuple[Mapping[str, Any], ...]  # the setting's record per unit, in the records' order
  shown: str  # the label as the group's name shows it

  @property
  def name(self) -> str:
    return f"{self.variant}/{self.shown}/{self.depth}"

  @property
  def seeds(self) -> tuple[int, ...]:
    return tuple(r.seed for r in self.runs)

  @property
  def gate(self) -> float | None:
    """The seeds' mean model accuracy (the pooled test's gate)."""
    found = [r.gate for r in self.runs]
    return None if None in found else float(np.mean(found))

  def pooled(self, rules: claim_rules.Rules | None = None) -> correctness.Matrix | None:
    """The seeds' matrices pooled (``stack``)."""
    return stack([r.matrix for r in self.runs], rules)


def collect(reading: Reading, records: Sequence[VariantRecord],
            load: correctness.Loader | None) -> list[Group]:
  """Every (variant, setting, depth) group of the records' results of ``reading.probe``, in
  the records' order then the probe's; runs in seed order."""
  runs: dict[tuple[str, str, str], list[Run]] = {}
  entries: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
  settings: dict[tuple[str, str, str], Any] = {}
  probe = reading.probe
  for record in records:
    found = (record.probes or {}).get(probe)
    if not found:
      continue
    stored = (load(record.name) if load is not None else None) or {}
    gate = standards.gate_accuracy(record)[0]
    for label, entry in found.items():
      setting = reading.parse(entry[reading.field],
                              f"{record.name}: probes.{probe}.{label}.{reading.field}")
      for depth, values in entry["depths"].items():
        key = (record.setup.variant, label, depth)
        matrix = stored.get(f"{probe}_{values['matrix']}") if "matrix" in values else None
        runs.setdefault(key, []).append(Run(record.name, record.setup.seed, matrix,
                                            stored.get(f"{PLAIN}_{depth}"), gate))
        entries.setdefault(key, []).append(entry)
        settings.setdefault(key, setting)
  return [Group(*key[:2], settings[key], key[2], tuple(sorted(found, key=lambda r: r.seed)),
                tuple(entries[key]), reading.shown(key[1]))
          for key, found in runs.items()]


def of_kind(groups: Sequence[Group], kind: type) -> list[Group]:
  """The groups whose setting is exactly of class ``kind``."""
  return [g for g in groups if type(g.setting) is kind]


@dataclasses.dataclass(frozen=True)
class PhaseRow:
  """The report's row of one group: accuracy pooled over its seeds, and per length L the
  accuracy by residue of the needle offset mod L with Wilson intervals. A study's subclass
  adds the columns of its own."""

  variant: str
  label: str
  kind: str  # the setting's kind (its class's name)
  short: str  # the kind with the length it is periodic in, if any (figure legends)
  depth: str
  seeds: int
  accuracy: float
  residues: Mapping[int, ResidueAccuracy]  # L -> accuracy by offset mod L


def phase_rows(groups: Sequence[Group], lengths: Sequence[int],
               row: Callable[..., PhaseRow]) -> list[PhaseRow]:
  """A row per group with every seed's matrix stored, in the groups' order: ``row(g,
  **common)`` builds it from the fields ``PhaseRow`` has (the residues only of the L whose
  residues the offsets cover equally often: J a multiple of L)."""
  rows = []
  for g in groups:
    matrix = g.pooled()
    if matrix is None:
      continue
    outcomes = matrix.correct_YxJ.ravel()
    offsets = np.broadcast_to(matrix.offsets_J, matrix.correct_YxJ.shape).ravel()
    residues = {m: summarize(outcomes, offsets % m, m, None) for m in lengths
                if matrix.offsets_J.size % m == 0}
    rows.append(row(g, variant=g.variant, label=g.label, depth=g.depth, seeds=len(g.runs),
                    accuracy=float(outcomes.mean()), residues=residues))
  return rows
