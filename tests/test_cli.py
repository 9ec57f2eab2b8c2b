"""Bad command-line input fails at once with one line naming the field or path (entry points)."""

from __future__ import annotations

import os
import subprocess
import sys
from unittest import mock

import pytest

from chunkformer import heldout, trainer
from chunkformer import runtime as runtime_lib
from chunkformer.config import ConfigError
from tests.test_train import smoke_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _entry_point(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                        env=dict(os.environ, PYTHONPATH=ROOT), timeout=300, check=False)


@pytest.mark.parametrize("override, says", [
    ("--config.model.attention.chunk_sise=5",
     "--config.model.attention.chunk_sise=5: the config has no field "
     "'model.attention.chunk_sise' (did you mean 'chunk_size'?)"),
])
def test_config_override_typo_is_one_line_naming_the_field(tmp_path, override, says):
  workdir = tmp_path / "run"
  done = _entry_point("train.py", "--config", "configs/smoke.py", "--workdir", str(workdir),
                      override)
  assert done.returncode == 1
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], done.stderr
  assert not workdir.exists()


def test_train_workdir_that_is_a_file_fails_before_any_work(tmp_path):
  path = tmp_path / "taken"
  path.write_text("keep me")
  with mock.patch.object(runtime_lib, "build", side_effect=AssertionError("work started")):
    with pytest.raises(ConfigError, match=r"--workdir '.*taken' is a file, not a directory"):
      trainer.train(smoke_config(), str(path))
  assert path.read_text() == "keep me"


def test_eval_on_sweep_results_names_the_sweep_command():
  with pytest.raises(ConfigError, match=r"holds a sweep \(its results.json\), not one run: "
                     r"rerun the sweep with `python eval.py --config configs/sweeps/demo.py"):
    heldout.evaluate_checkpoint(os.path.join(ROOT, "results", "demo"))
