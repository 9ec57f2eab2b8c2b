"""What a new user meets first: the documented commands run cleanly and bad input ends in one
line saying what to change (ingest as a module, a corpus too small for a held-out split, the
benchmark scripts run as files, a library ValueError in train.py, a foreign ``kernels`` or
``configs`` package)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from chunkformer.data import code, ingest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT)
# Every benchmark script (the helpers they share, results_io.py and accelerator_rows.py, are
# modules, not scripts).
BENCH = sorted(name[:-3] for name in os.listdir(os.path.join(ROOT, "bench"))
               if name.endswith(".py") and name not in ("results_io.py", "accelerator_rows.py"))


def test_ingest_run_as_a_module_prints_no_runtime_warning():
  done = subprocess.run([sys.executable, "-m", "chunkformer.data.ingest", "--help"], cwd=ROOT,
                        env=ENV, capture_output=True, text=True, timeout=120)
  assert done.returncode == 0 and "--heldout_fraction" in done.stdout, done.stderr
  assert "Warning" not in done.stderr, done.stderr


def _corpus(directory, names):
  directory.mkdir()
  for name in names:
    (directory / name).write_text(f"text of {name}\n" * 20)
  return str(directory / "*.txt")


def _names(keep, count):
  """``count`` file names whose held-out scores satisfy ``keep``, in a fixed order."""
  names = (f"file{i}.txt" for i in range(10_000))
  return [n for n in names if keep(code.heldout_score(n))][:count]


@pytest.mark.parametrize("split, fraction, keep", [
    ("heldout", 0.1, lambda score: score >= 0.3),  # none below the default cut of 0.1
    ("train", 0.9, lambda score: score < 0.7),  # all below a cut of 0.9
])
def test_an_empty_split_names_the_heldout_fraction_that_gives_it_one_document(
    tmp_path, split, fraction, keep):
  pattern = _corpus(tmp_path / "corpus", _names(keep, 3))
  with pytest.raises(ingest.IngestError) as raised:
    ingest.ingest(pattern, "bytes", str(tmp_path / "out"), heldout_fraction=fraction,
                  progress=False)
  message = str(raised.value)
  assert message.startswith(f"no document in split {split!r} (3 documents from 3 files") and (
      "\n" not in message), message
  assert not (tmp_path / "out").exists()
  advised = float(re.search(r"--heldout_fraction ([0-9.]+) (holds out|keeps)", message).group(1))
  manifest = ingest.ingest(pattern, "bytes", str(tmp_path / "out"), heldout_fraction=advised,
                           progress=False)
  assert manifest["splits"][split]["documents"] == 1  # exactly the one document advised
  assert manifest["splits"]["train"]["documents"] + manifest["splits"]["heldout"]["documents"] == 3


def test_every_benchmark_script_runs_as_a_file_from_anywhere(tmp_path):
  # Run as a file, Python puts bench/ first on sys.path, where bench/kernels.py lies.
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  procs = {name: subprocess.Popen([sys.executable, os.path.join(ROOT, "bench", f"{name}.py"),
                                   "--help"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for name in BENCH}
  failed = {}
  for name, proc in procs.items():
    out, err = proc.communicate(timeout=300)
    if proc.returncode != 0 or "usage" not in out:
      failed[name] = err[-1500:]
  assert not failed, failed


def test_the_kernel_benchmark_runs_as_a_module_too():
  done = subprocess.run([sys.executable, "-m", "bench.kernels", "--help"], cwd=ROOT, env=ENV,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0 and "usage" in done.stdout, done.stderr[-1500:]


def _train(workdir, dataset) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, "train.py", "--config", "configs/smoke.py", "--workdir", str(workdir),
       "--config.data.task=corpus", f"--config.data.path={dataset}",
       "--config.model.vocab_size=260"], cwd=ROOT, env=ENV, capture_output=True, text=True,
      timeout=300)


# train.py with the library raising a plain ValueError (not a ConfigError) where it trains.
RAISING_TRAIN = """
import runpy, sys
from chunkformer import trainer

def train(*args, **kwargs):
  raise ValueError("shards of another tokenizer in data.path (a library check)")

trainer.train = train
sys.argv = ["train.py", "--config", "configs/smoke.py", "--workdir", sys.argv[1]]
runpy.run_path("train.py", run_name="__main__")
"""


def test_train_ends_a_library_value_error_in_one_line(tmp_path):
  done = subprocess.run([sys.executable, "-c", RAISING_TRAIN, str(tmp_path / "run")], cwd=ROOT,
                        env=ENV, capture_output=True, text=True, timeout=300)
  lines = done.stderr.strip().splitlines()
  assert done.returncode == 1 and len(lines) == 1, done.stderr[-3000:]
  assert lines[0] == "error: shards of another tokenizer in data.path (a library check)"


def test_a_damaged_dataset_manifest_is_named_in_one_line(tmp_path):
  dataset = tmp_path / "dataset"
  dataset.mkdir()
  (dataset / "manifest.json").write_text("{")  # a dataset damaged by an interrupted copy
  done = _train(tmp_path / "run", dataset)
  lines = done.stderr.strip().splitlines()
  assert done.returncode == 1 and len(lines) == 1, done.stderr[-3000:]
  assert lines[0].startswith(f"error: config field 'data.path': "
                             f"{str(dataset / 'manifest.json')!r} is not an ingested dataset's "
                             "manifest (JSONDecodeError: "), lines
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["kernels", "configs"])
@pytest.mark.parametrize("imported_first", [False, True])
def test_a_foreign_package_of_the_same_name_is_refused_at_import(tmp_path, name,
                                                                 imported_first):
  foreign = tmp_path / "site" / name
  foreign.mkdir(parents=True)
  (foreign / "__init__.py").write_text("# another distribution's package\n")
  script = (f"import {name}\n" if imported_first else "") + "import chunkformer.config\n"
  done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path,
                        env=dict(os.environ, PYTHONPATH=f"{tmp_path / 'site'}{os.pathsep}{ROOT}"),
                        capture_output=True, text=True, timeout=120)
  last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
  assert done.returncode == 1, done.stderr
  assert last.startswith(f"ImportError: chunkformer needs its own top-level package {name!r} "
                         f"({os.path.join(ROOT, name, '__init__.py')}), but {name!r} resolves "
                         f"to {foreign / '__init__.py'}"), last
  assert f"pip uninstall {name}" in last


def test_chunkformer_imports_with_its_own_packages_from_anywhere(tmp_path):
  done = subprocess.run([sys.executable, "-c", "import chunkformer, kernels, configs; "
                         "print(kernels.__file__, configs.__file__)"], cwd=tmp_path, env=ENV,
                        capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr
  assert done.stdout.split() == [os.path.join(ROOT, "kernels", "__init__.py"),
                                 os.path.join(ROOT, "configs", "__init__.py")]
