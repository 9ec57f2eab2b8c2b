"""The notebooks as stored, and the small library pieces they use (their cells run under
``pytest --nbmake notebooks`` with CHUNKFORMER_FAST=1; these tests check what that cannot)."""

import dataclasses
import importlib.util
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from chunkformer import chunking, notebook
from chunkformer.config import AttentionConfig, DataConfig
from chunkformer.data import kv
from chunkformer.evaluation.records.variant import VariantRecord, VariantSetup
from chunkformer.evaluation.stats import analysis_types as records
from chunkformer.evaluation.stats import periodicity as stats
from chunkformer.evaluation.sweep import config as sweep_config
from chunkformer.explainers import anatomy, kernel_check, layout_plots
from configs.sweeps import demo, notebooks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK_DIR = os.path.join(ROOT, "notebooks")


def _generator():
  spec = importlib.util.spec_from_file_location(
      "make_notebooks", os.path.join(ROOT, "scripts", "make_notebooks.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


GENERATOR = _generator()


@pytest.mark.parametrize("name", sorted(GENERATOR.NOTEBOOKS))
def test_stored_notebook_is_the_generated_one_without_outputs(name):
  path = os.path.join(NOTEBOOK_DIR, f"{name}.ipynb")
  with open(path, encoding="utf-8") as f:
    text = f.read()
  assert text == GENERATOR.nbformat.writes(GENERATOR.build(name)) + "\n", (
      "stale notebook: run python scripts/make_notebooks.py")
  cells = json.loads(text)["cells"]
  code = [c for c in cells if c["cell_type"] == "code"]
  assert all(c["outputs"] == [] and c["execution_count"] is None for c in code)
  assert cells[0]["cell_type"] == "markdown"
  first = "".join(cells[0]["source"])
  assert (f"https://colab.research.google.com/github/chunkformer/chunkformer/blob/main/"
          f"notebooks/{name}.ipynb") in first
  assert "Runtime on a CPU" in first
  setup = "".join(code[0]["source"])
  assert '"google.colab" in sys.modules' in setup and "pip" in setup
  assert json.loads(text)["metadata"]["kernelspec"]["name"] == "python3"


def test_python3_kernel_is_this_interpreter():
  # nbmake starts the notebooks' kernelspec "python3": it must be ipykernel on the interpreter
  # running the tests (the venv's), or the notebooks would import another environment.
  from jupyter_client.manager import KernelManager

  command = KernelManager(kernel_name="python3").format_kernel_cmd()
  assert os.path.realpath(command[0]) == os.path.realpath(sys.executable)
  assert command[1:3] == ["-m", "ipykernel_launcher"]


def test_full_size_notebook_variants_are_the_demos_own():
  # Same configs -> the same run directories: a finished demo run is never retrained.
  base = {v.name: v.config for v in sweep_config.resolve(demo.get_config(), "/unused").variants}
  for name in notebooks.NOTEBOOKS:
    variants = sweep_config.resolve(notebooks.get_config(name), "/unused").variants
    assert variants and all(v.config == base[v.name] for v in variants)
    fast = sweep_config.resolve(notebooks.get_config(f"{name},fast"), "/unused").variants
    assert all(f.config.train.steps < v.config.train.steps for f, v in zip(fast, variants,
                                                                            strict=True))
  with pytest.raises(ValueError, match="notebook"):
    notebooks.get_config("quickstart,slow")


def test_fast_mode_writes_into_a_fresh_temporary_directory(monkeypatch, tmp_path):
  monkeypatch.setenv(notebook.FAST_ENV, "1")
  first, second = notebook.workdir("demo"), notebook.workdir("demo")
  assert first != second and not os.listdir(first)
  monkeypatch.setenv(notebook.FAST_ENV, "0")
  monkeypatch.setenv(notebook.RUNS_ENV, str(tmp_path))
  assert notebook.workdir("demo") == os.path.join(str(tmp_path), "demo")


def test_tables_print_missing_values_as_dashes():
  table = notebook.markdown_table(["a", "b"], [[1, None], [0.12345, float("nan")]], digits=2)
  assert table.splitlines() == ["| a | b |", "|---|---|", "| 1 | - |", "| 0.12 | - |"]
  base = stats.analyze(np.ones((2, 4)), np.arange(4), [2], num_resamples=10,
                       num_permutations=10)
  phase = records.PhaseTable((0, 1), records.Curve((1.0, 0.25), (0.9, 0.1), (1.0, 0.4)), 1,
                             records.Interval(0.75, None, None), 1e-4)
  analysis = dataclasses.replace(base, phase=phase, detected_period=2,
                                 by_chunk_size=(records.PeriodTest(2, phase, 0.5, 1e-4),))
  record = VariantRecord(VariantSetup("m", "fixed", "fixed"), analysis, "needle", 1, None)
  row = notebook.phase_table([record]).splitlines()[2]
  assert row == "| m | 1.00 [0.90, 1.00] | 0.25 [0.10, 0.40] | 0.750 | 2 | 1.0e-04 |"


def test_token_labels_are_one_character_each():
  data = DataConfig(num_symbols=16)
  tokens = [kv.BOS, kv.FILLER_BASE, kv.symbol_base(data), kv.symbol_base(data) + 15, kv.QUERY]
  assert notebook.token_labels(tokens, data) == ["^", ".", "a", "p", "?"]
  code_labels = notebook.token_labels(list(b"a b\n"), DataConfig(task="code"))
  assert code_labels == ["a", "·", "b", "↵"]
  assert all(len(c) == 1 for c in notebook.token_labels(list(range(260)),
                                                        DataConfig(task="code")))


def test_delimiter_boundaries_move_with_the_text_and_fixed_ones_do_not():
  text = np.frombuffer(notebook.stdlib_snippet("calendar.py"), np.uint8)
  assert text.size > 40 and text[:4].tobytes() == b"def "
  shifted = np.concatenate([np.frombuffer(b"==", np.uint8), text])
  rule = AttentionConfig(kind="dynamic", boundary="delimiter", delimiters="10,32", chunk_size=4,
                         min_chunk=2, max_chunk=8)
  rule_of_the_library = jax.jit(lambda tokens: chunking.enforce_lengths(
      chunking.delimiter_proposals(tokens, (10, 32)), jnp.zeros_like(tokens), min_chunk=2,
      max_chunk=8))
  want = np.asarray(rule_of_the_library(jnp.asarray(text[None].astype(np.int32))))[0]
  plain, moved = anatomy.rule_end_flags(rule, text), anatomy.rule_end_flags(rule, shifted)
  np.testing.assert_array_equal(plain, want)
  resync = int(np.flatnonzero(plain)[1]) + 1  # both have closed a chunk at a delimiter by then
  np.testing.assert_array_equal(moved[2 + resync:], plain[resync:])
  grid = AttentionConfig(kind="dynamic", boundary="fixed", chunk_size=4)
  assert not np.array_equal(anatomy.rule_end_flags(grid, shifted)[2:],
                            anatomy.rule_end_flags(grid, text)[:-2])


def test_layout_pictures_are_written(tmp_path):
  labels = list("def f(x):\n  return x\n")
  ends = np.array([c in " \n" for c in labels])
  seg = (np.arange(len(labels)) >= 10).astype(np.int32)
  for path in (layout_plots.plot_packed_layout(tmp_path / "packed.png", labels, ends, seg,
                                               capacity=16, window=3),
               layout_plots.plot_chunks(tmp_path / "chunks.png", {"a": (labels, ends)})):
    with open(path, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  chunk, closed = layout_plots.chunk_index(np.array([0, 1, 0, 0, 1, 0], bool))
  np.testing.assert_array_equal(chunk, [0, 0, 1, 1, 1, 2])
  np.testing.assert_array_equal(closed, [1, 1, 1, 1, 1, 0])


def test_kernel_check_reports_zero_difference_for_the_reference_itself():
  ends = jnp.asarray(np.random.default_rng(0).random((1, 24)) < 0.3)
  seg = jnp.asarray((np.arange(24) >= 10)[None].astype(np.int32))
  case = kernel_check.attention_case(ends, seg, capacity=16, heads=2, kv_heads=1, head_dim=8)
  [record] = kernel_check.check_chunk_attention(case, window=3, implementations=("xla",))
  assert record["output"] == 0.0 and record["dq"] == 0.0 and record["d_entry_v"] == 0.0
  [timing] = kernel_check.time_chunk_attention(case, window=3, implementations=("xla",),
                                               repeats=1)
  assert timing["forward_s"] > 0 and timing["forward_backward_s"] > 0
