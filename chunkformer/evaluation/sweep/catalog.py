"""A study, as the engine sees it, and the one place the studies are installed.

A study (``chunkformer.studies.<name>``) is a package that knows one question: its probes, its
claims with their judging hooks, and its part of the report. It exports one ``Study``; the
studies' package lists them (``chunkformer.studies.STUDIES``) and ``install``s them into the
engine's registries: ``probes.registry`` (probes and their option checks), ``claims.registry``
(claims and judging hooks) and ``report.sections`` (figures, probe sections, summary and report
sections). The engine never imports a study and a study never imports another
(``tests/test_imports.py``); an entry point installs the studies before it runs a sweep.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from chunkformer.evaluation.claims import registry as claim_registry
from chunkformer.evaluation.probes import registry as probe_registry
from chunkformer.evaluation.probes.base import Probe
from chunkformer.evaluation.report import sections


@dataclasses.dataclass(frozen=True)
class Study:
  """One study's entries in the engine's registries (module docstring)."""

  name: str
  probes: Mapping[str, Probe] = dataclasses.field(default_factory=dict)
  option_checks: Mapping[str, Callable[..., None]] = dataclasses.field(default_factory=dict)
  claims: Mapping[str, claim_registry.ClaimFunction] = dataclasses.field(default_factory=dict)
  judging: claim_registry.Judging = claim_registry.Judging()
  report: sections.ReportHooks = sections.ReportHooks()


def install(studies: Sequence[Study]) -> None:
  """Registers each study's entries, in the order given (the order probes run, claims are
  listed and report sections follow each other). Installing the same studies again changes
  nothing; a study whose name is taken by a different study is refused."""
  for study in studies:
    if INSTALLED.get(study.name, study) is not study:
      raise ValueError(f"a different study named {study.name!r} is installed already")
    if study.name in INSTALLED:
      continue
    probe_registry.register(study.probes, study.option_checks)
    claim_registry.register(study.name, study.claims, study.judging)
    sections.register(study.name, study.report)
    INSTALLED[study.name] = study


INSTALLED: dict[str, Study] = {}
