"""Report code formats; it computes nothing. A report module (the engine's ``report/`` or a
study's) may read types and constants of the judging and statistics layers, but never call
their functions: every number a report shows is computed once by the judge (``Judged``), so a
walk from a sweep's workdir through judge and report never returns to claims/ or stats/."""

from __future__ import annotations

import ast
import importlib
import inspect

from tests import test_imports

COMPUTING_LAYERS = ("claims", "stats")


def _computes(obj) -> bool:
  return inspect.isfunction(obj) or inspect.isbuiltin(obj)


def _calls_into_computing_layers(modules: dict[str, str]) -> set[tuple[str, str]]:
  """(report module, claims/stats function) pairs a report module names."""
  found = set()
  for module, path in modules.items():
    if test_imports._layer(module) != "report":
      continue
    tree = ast.parse(open(path).read())
    aliases = {}  # local name -> imported claims/stats module
    for node in ast.walk(tree):
      if not (isinstance(node, ast.ImportFrom) and node.module and not node.level):
        continue
      for alias in node.names:
        full = f"{node.module}.{alias.name}"
        if full in modules and test_imports._layer(full) in COMPUTING_LAYERS:
          aliases[alias.asname or alias.name] = full
        elif (node.module in modules
              and test_imports._layer(node.module) in COMPUTING_LAYERS
              and _computes(getattr(importlib.import_module(node.module), alias.name))):
          found.add((module, full))
    for node in ast.walk(tree):
      if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
          and node.value.id in aliases):
        target = importlib.import_module(aliases[node.value.id])
        if _computes(getattr(target, node.attr)):
          found.add((module, f"{aliases[node.value.id]}.{node.attr}"))
  return found


def test_no_report_module_calls_a_claims_or_stats_function():
  found = _calls_into_computing_layers(test_imports._modules())
  assert not found, f"report code computing (move it into the judge's tables): {sorted(found)}"


def test_the_check_sees_a_report_calling_into_the_claims(tmp_path):
  report = tmp_path / "r.py"
  report.write_text("from chunkformer.evaluation.claims import seed_pooling\n"
                    "from chunkformer.evaluation.stats.holm import holm\n"
                    "from chunkformer.evaluation.claims.seed_pooling import POOLED_SUFFIX\n"
                    "x = seed_pooling.pooled_records, seed_pooling.POOLED_SUFFIX\n")
  modules = {**test_imports._modules(), "chunkformer.evaluation.report.toy": str(report)}
  assert {f for f in _calls_into_computing_layers(modules)
          if f[0] == "chunkformer.evaluation.report.toy"} == {
      ("chunkformer.evaluation.report.toy", "chunkformer.evaluation.stats.holm.holm"),
      ("chunkformer.evaluation.report.toy",
       "chunkformer.evaluation.claims.seed_pooling.pooled_records")}


def test_report_modules_read_no_probe_module_but_the_protocol_types():
  # A probe's record is read through its typed record (records/), never the probe's module.
  graph = test_imports._graph(test_imports._modules())
  found = {(m, t) for m, targets in graph.items() if test_imports._layer(m) == "report"
           for t in targets if test_imports._layer(t) == "probes"
           and t not in ("chunkformer.evaluation.probes", "chunkformer.evaluation.probes.base")}
  assert not found, f"report modules importing probe modules: {sorted(found)}"
