"""The import graph of chunkformer/ and kernels/ has no cycle (package inits included), and no
module of the package, the kernels, the scripts or the benchmarks is over MAX_LINES lines."""

from __future__ import annotations

import ast
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("chunkformer", "kernels")
SIZED = PACKAGES + ("scripts", "bench")  # directories whose modules must stay small
MAX_LINES = 450


def _modules() -> dict[str, str]:
  found = {}
  for package in PACKAGES:
    for directory, _, files in os.walk(os.path.join(ROOT, package)):
      for name in files:
        if name.endswith(".py"):
          path = os.path.join(directory, name)
          module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
          found[module.removesuffix(".__init__")] = path
  return found


def _graph(modules: dict[str, str]) -> dict[str, set[str]]:
  """module -> modules it imports anywhere (lazy imports too). Importing a.b.c also runs the
  package a.b (its __init__), except from inside a.b itself (it is loaded already)."""
  graph = {}
  for module, path in modules.items():
    targets = set()
    for node in ast.walk(ast.parse(open(path).read())):
      names = []
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                 else node.module for a in node.names]
      for name in names:
        while name and name not in modules:
          name = name.rpartition(".")[0]
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
          target = ".".join(parts[:i])
          inside = module == target or module.startswith(target + ".")
          if target in modules and not inside:
            targets.add(target)
    graph[module] = targets
  return graph


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
  """Strongly connected components with more than one module (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = set()
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.add(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(frozenset(component))

  for v in graph:
    if v not in index:
      visit(v)
  return found


def test_no_import_cycle_in_chunkformer_or_kernels():
  cycles = [sorted(c) for c in _cycles(_graph(_modules()))]
  assert not cycles, f"import cycles: {cycles}"


def test_a_lazy_import_back_into_a_package_is_a_cycle(tmp_path):
  # config once reached data by an import inside a method; the graph must still see it.
  for name, text in (("a/__init__.py", ""), ("a/b.py", "import a.c\n"),
                     ("a/c.py", "def f():\n  from a import b\n")):
    (tmp_path / name).parent.mkdir(exist_ok=True)
    (tmp_path / name).write_text(text)
  modules = {m: str(tmp_path / f"{m.replace('.', '/')}.py") for m in ("a.b", "a.c")}
  modules["a"] = str(tmp_path / "a/__init__.py")
  assert _cycles(_graph(modules)) == [frozenset({"a.b", "a.c"})]


def test_the_cycle_finder_finds_a_cycle():
  assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]


def test_kernels_import_nothing_from_chunkformer():
  graph = _graph(_modules())
  assert not {(m, t) for m, targets in graph.items() if m.startswith("kernels")
              for t in targets if t.startswith("chunkformer")}


def _python_files(directory: str) -> list[str]:
  return sorted(os.path.join(d, n) for d, _, files in os.walk(os.path.join(ROOT, directory))
                for n in files if n.endswith(".py"))


@pytest.mark.parametrize("directory", SIZED)
def test_no_module_is_over_max_lines(directory):
  files = _python_files(directory)
  assert files, f"no modules found under {directory}/"
  too_long = {os.path.relpath(f, ROOT): n for f in files
              if (n := sum(1 for _ in open(f))) > MAX_LINES}
  assert not too_long, f"modules over {MAX_LINES} lines (split them): {too_long}"


def test_config_sections_import_nothing_from_chunkformer():
  # The leaf that lets data/ use its section while config.py imports data/ (see its __init__).
  graph = _graph(_modules())
  assert not {(m, t) for m, targets in graph.items() if m.startswith("chunkformer.config_sections")
              for t in targets if t.startswith("chunkformer") and
              not t.startswith("chunkformer.config_sections")}


def test_data_sits_below_the_run_config_and_run_directories():
  # config.py imports data/ (its task checks); data/ reading a run directory or the run config
  # would run back up (a run's tokens live in chunkformer/run_tokens.py).
  graph = _graph(_modules())
  above = {"chunkformer.config", "chunkformer.workdir", "chunkformer.run_tokens"}
  assert not {(m, t) for m, targets in graph.items() if m.startswith("chunkformer.data")
              for t in targets if t in above}


def test_caches_import_no_attention_kind():
  # The kinds hand their submodules to the caches' steps, never the reverse (WORKSPACE.md,
  # "How to add an attention kind").
  graph = _graph(_modules())
  assert not {(m, t) for m, targets in graph.items() if m.startswith("chunkformer.kvcache")
              for t in targets if t.startswith("chunkformer.attention")}


def _reaches(graph: dict[str, set[str]], start: str, target: str) -> bool:
  """Whether ``start`` imports ``target``, directly or through other modules."""
  seen, todo = set(), [start]
  while todo:
    for nxt in graph.get(todo.pop(), ()):
      if nxt == target:
        return True
      if nxt not in seen:
        seen.add(nxt)
        todo.append(nxt)
  return False


def _sparse_prefill_above_decode(graph: dict[str, set[str]]) -> set[str]:
  return {m for m in graph if (m == "chunkformer.sparse_prefill" or
                               m.startswith("chunkformer.sparse_prefill."))
          and _reaches(graph, m, "chunkformer.decode")}


def test_sparse_prefill_sits_below_decode():
  # decode.prefill(sparse=) runs the patterns and plans, so sparse_prefill/ (its search
  # included: it builds its caches with model.init_cache) never reaches back up into decode,
  # directly or through another module.
  above = _sparse_prefill_above_decode(_graph(_modules()))
  assert not above, f"sparse_prefill modules importing chunkformer.decode: {sorted(above)}"


def test_the_decode_check_sees_a_direct_and_an_indirect_import():
  graph = {"chunkformer.decode": {"chunkformer.sparse_prefill.plan"},
           "chunkformer.sparse_prefill.plan": set(),
           "chunkformer.sparse_prefill.search": {"chunkformer.decode"},
           "chunkformer.sparse_prefill.probe": {"chunkformer.evaluation.x"},
           "chunkformer.evaluation.x": {"chunkformer.decode"}}
  assert _sparse_prefill_above_decode(graph) == {"chunkformer.sparse_prefill.search",
                                                 "chunkformer.sparse_prefill.probe"}


# The evaluation engine and the studies built on it share one layer order, lowest first: a
# module may import its own layer and the layers below it (the engine's or its own study's),
# never one above; probes and claims share a rank and never import each other. A study's
# package init assembles it and sits on top.
EVALUATION = "chunkformer.evaluation"
STUDIES = "chunkformer.studies"
LAYERS = {"stats": 0, "records": 1, "probes": 2, "claims": 2, "report": 3, "sweep": 4,
          "study": 5}
# What the statistics may import besides themselves: the error type every argument check raises
# (and the packages it sits in, whose inits import nothing).
STATS_MAY_IMPORT = {"chunkformer", "chunkformer.config_sections",
                    "chunkformer.config_sections.errors"}
STATS_LIBRARIES = {"numpy", "scipy"}


def _study(module: str) -> str | None:
  """'chunkformer.studies.paper.claims.paper_rows' -> 'paper'; None outside the studies."""
  if not module.startswith(STUDIES + "."):
    return None
  return module[len(STUDIES) + 1:].split(".")[0]


def _layer(module: str) -> str | None:
  """'chunkformer.evaluation.claims.judgments' -> 'claims', a study's own layers alike
  ('chunkformer.studies.paper.claims.x' -> 'claims'; the study's init -> 'study'); None
  outside the engine and the studies."""
  if module.startswith(EVALUATION + "."):
    return module[len(EVALUATION) + 1:].split(".")[0]
  if module.startswith(STUDIES + "."):
    parts = module[len(STUDIES) + 1:].split(".")
    return parts[1] if len(parts) > 1 else "study"
  return None


def _layer_violations(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
  bad = set()
  for module, targets in graph.items():
    mine = _layer(module)
    for target in targets:
      theirs = _layer(target)
      if mine is None:
        continue  # outside the evaluation package: test_the_core_library_imports_no_package...
      if mine == "stats":  # other statistics only: the engine's, or its own study's
        if not (target in STATS_MAY_IMPORT or target in (EVALUATION, STUDIES)
                or (theirs == "stats" and _study(target) in (None, _study(module)))):
          bad.add((module, target))
      elif theirs is not None and theirs != mine and LAYERS[theirs] >= LAYERS[mine]:
        bad.add((module, target))
  return bad


def _study_violations(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
  """The engine importing a study, or a study importing another study."""
  bad = set()
  for module, targets in graph.items():
    if not module.startswith((EVALUATION, STUDIES)) or module == STUDIES:
      continue  # the studies' package itself lists them all
    for target in targets:
      theirs = _study(target)
      if theirs is None:
        continue
      if module.startswith(EVALUATION) or _study(module) != theirs:
        bad.add((module, target))
  return bad


def test_every_evaluation_module_sits_in_a_layer():
  modules = [m for m in _modules() if m.startswith((EVALUATION + ".", STUDIES + "."))]
  assert modules and not {m for m in modules if _layer(m) not in LAYERS}


def test_evaluation_and_studies_import_only_downwards():
  violations = _layer_violations(_graph(_modules()))
  assert not violations, f"imports against the layer order {LAYERS}: {sorted(violations)}"


def test_the_engine_imports_no_study_and_no_study_another():
  violations = _study_violations(_graph(_modules()))
  assert not violations, f"engine -> study or study -> study imports: {sorted(violations)}"


def test_the_study_check_sees_the_engine_and_a_study_reaching_out():
  graph = {f"{EVALUATION}.sweep.outputs": {f"{STUDIES}.paper.report.paper_table"},
           f"{STUDIES}.eviction.claims.e": {f"{STUDIES}.needles.claims.judgments"},
           f"{STUDIES}.eviction.claims.f": {f"{STUDIES}.eviction.claims.e",
                                            f"{EVALUATION}.claims.standards"},
           STUDIES: {f"{STUDIES}.paper", f"{STUDIES}.needles"}}
  assert _study_violations(graph) == {
      (f"{EVALUATION}.sweep.outputs", f"{STUDIES}.paper.report.paper_table"),
      (f"{STUDIES}.eviction.claims.e", f"{STUDIES}.needles.claims.judgments")}


def test_the_layer_check_sees_an_upward_and_a_sideways_import():
  graph = {f"{EVALUATION}.stats.a": {f"{EVALUATION}.records.b"},  # upward
           f"{EVALUATION}.probes.c": {f"{EVALUATION}.claims.d"},  # sideways
           f"{EVALUATION}.report.e": {f"{EVALUATION}.claims.d", f"{EVALUATION}.stats.a"},
           f"{STUDIES}.paper.report.t": {f"{STUDIES}.paper.claims.rows"},  # a report computing
           f"{STUDIES}.paper.claims.u": {f"{STUDIES}.paper.report.t"}}  # upward, in a study
  assert _layer_violations(graph) == {
      (f"{EVALUATION}.stats.a", f"{EVALUATION}.records.b"),
      (f"{EVALUATION}.probes.c", f"{EVALUATION}.claims.d"),
      (f"{STUDIES}.paper.claims.u", f"{STUDIES}.paper.report.t")}


def test_statistics_use_only_numpy_scipy_and_the_standard_library():
  found = {}
  for module, path in _modules().items():
    if _layer(module) != "stats":
      continue
    for node in ast.walk(ast.parse(open(path).read())):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
               [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
      for name in names:
        top = name.split(".")[0]
        allowed = (top in STATS_LIBRARIES or top in sys.stdlib_module_names
                   or name.startswith(EVALUATION + ".stats") or name in STATS_MAY_IMPORT
                   or name.startswith(f"{STUDIES}.{_study(module)}.stats"))
        if not allowed:
          found.setdefault(module, []).append(name)
  assert not found, f"statistics importing more than numpy/scipy: {found}"


# Packages built on the library (importers, the study, the notebooks' explainers): the core
# library (model, attention, data, training, decoding) never imports them; that an import of
# a loaded model's token map once went from runtime.py up into convert/ is what this guards.
APPLICATIONS = ("chunkformer.convert", "chunkformer.evaluation", "chunkformer.explainers",
                "chunkformer.studies")
MAY_IMPORT_APPLICATIONS = APPLICATIONS + ("chunkformer.notebook",)


def _upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
  def inside(module, packages):
    return any(module == p or module.startswith(p + ".") for p in packages)
  return {(m, t) for m, targets in graph.items() if m.startswith("chunkformer")
          and not inside(m, MAY_IMPORT_APPLICATIONS) for t in targets if inside(t, APPLICATIONS)}


def test_the_core_library_imports_no_package_built_on_it():
  upward = _upward(_graph(_modules()))
  assert not upward, f"core modules importing {APPLICATIONS}: {sorted(upward)}"


def test_the_upward_check_sees_runtime_reaching_into_convert():
  graph = {"chunkformer.runtime": {"chunkformer.convert.token_map"},
           "chunkformer.convert.qwen3": {"chunkformer.runtime"},
           "chunkformer.explainers.anatomy": {"chunkformer.evaluation.probes.trained"}}
  assert _upward(graph) == {("chunkformer.runtime", "chunkformer.convert.token_map")}
