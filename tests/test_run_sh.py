"""run.sh's JAX flavours (CHUNKFORMER_JAX), checked with its dry run: nothing is installed."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(tmp_path, *args, flavour=None, dry=True, python=None):
  env = {k: v for k, v in os.environ.items() if k != "CHUNKFORMER_JAX"}
  env["CHUNKFORMER_VENV"] = str(tmp_path / "venv")
  if python is not None:
    env["PYTHON"] = python
  if dry:
    env["CHUNKFORMER_DRY_RUN"] = "1"
  if flavour is not None:
    env["CHUNKFORMER_JAX"] = flavour
  return subprocess.run(["bash", str(ROOT / "run.sh"), *args], env=env, capture_output=True,
                        text=True, timeout=60)


def _fields(out: str) -> dict[str, str]:
  head, _, state = out.strip().partition(" state=")
  fields = dict(kv.split("=", 1) for kv in head.split())
  return dict(fields, state=state)


def test_flavours_pick_their_locks_and_stamps(tmp_path):
  seen = {}
  for flavour, expected in ((None, ["requirements.lock"]),
                            ("cpu", ["requirements.lock"]),
                            ("cuda12", ["requirements.lock", "requirements-cuda12.lock"]),
                            ("tpu", ["requirements.lock", "requirements-tpu.lock"])):
    done = _run(tmp_path, "python", "-V", flavour=flavour)
    assert done.returncode == 0, done.stderr
    f = _fields(done.stdout)
    assert f["flavour"] == (flavour or "cpu")
    assert f["locks"].split(",") == expected
    assert f["state"] == "install due"  # no environment yet
    seen[flavour] = f["stamp"]
  assert seen[None] == seen["cpu"]  # cpu is the default
  assert len({seen["cpu"], seen["cuda12"], seen["tpu"]}) == 3  # switching flavour reinstalls
  test_job = _fields(_run(tmp_path, "test", flavour="cuda12").stdout)
  assert test_job["locks"].split(",")[-1] == "requirements-test.lock"
  assert not (tmp_path / "venv").exists()  # the dry run created nothing


@pytest.mark.parametrize("flavour,job,message", [
    ("rocm", "demo",
     "error: CHUNKFORMER_JAX=rocm: expected cpu (default), cuda12, tpu or system"),
    ("cpu", "bench",
     "usage: [CHUNKFORMER_JAX=cpu|cuda12|tpu|system] ./run.sh {demo|test|python ...}"),
])
def test_bad_flavour_or_job_is_one_line_before_any_install(tmp_path, flavour, job, message):
  done = _run(tmp_path, job, flavour=flavour, dry=False)  # a real run: refused before installing
  assert done.returncode == 2
  assert done.stderr.strip() == message and done.stdout == ""
  assert not (tmp_path / "venv").exists()


def test_locks_pin_the_project_jax():
  """Every accelerator lock line is an exact pin, and the plugins match requirements.lock's jax."""
  base = dict(line.split("==") for line in (ROOT / "requirements.lock").read_text().splitlines()
              if "==" in line and not line.startswith("#"))
  for name in ("requirements-cuda12.lock", "requirements-tpu.lock"):
    lines = [x for x in (ROOT / name).read_text().splitlines() if x and not x.startswith("#")]
    assert lines and all("==" in x for x in lines), name
  cuda = (ROOT / "requirements-cuda12.lock").read_text()
  assert f"jax-cuda12-plugin=={base['jax']}" in cuda and f"jax-cuda12-pjrt=={base['jax']}" in cuda


def _system_jax():
  spec = importlib.util.spec_from_file_location("system_jax", ROOT / "scripts" / "system_jax.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_system_flavour_uses_this_pythons_jax_and_installs_only_what_it_lacks(tmp_path):
  """This test's Python has the whole pinned stack: the image's JAX is taken as it is and
  nothing of requirements.lock is missing; the test job's lock adds only what is not here."""
  import jax

  done = _run(tmp_path, "python", "-V", flavour="system", python=sys.executable)
  assert done.returncode == 0, done.stderr
  f = _fields(done.stdout)
  assert f["flavour"] == "system" and f["locks"] == "requirements.lock"
  assert f["jax"] == jax.__version__ and f["missing"] == "-"
  cpu = _fields(_run(tmp_path, "python", "-V", flavour="cpu", python=sys.executable).stdout)
  assert f["stamp"] != cpu["stamp"]  # switching to or from the image's JAX reinstalls
  assert not (tmp_path / "venv").exists()


def test_system_flavour_refuses_a_python_without_jax_in_one_line(tmp_path):
  bare = tmp_path / "python-without-site"  # the same interpreter, its site-packages unseen
  bare.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
  bare.chmod(0o755)
  done = _run(tmp_path, "demo", flavour="system", dry=False, python=str(bare))
  assert done.returncode == 2 and done.stdout == ""
  assert done.stderr.strip() == ("error: CHUNKFORMER_JAX=system: this Python has no jax; use an "
                                 "image with JAX 0.10.2..0.11.2 or CHUNKFORMER_JAX=cpu|cuda12|tpu")
  assert not (tmp_path / "venv").exists()


@pytest.mark.parametrize("version,ok", [("0.10.2", True), ("0.11.2", True), ("0.11.0", True),
                                        ("0.10.1", False), ("0.11.3", False), ("0.12.0", False),
                                        ("0.11.2.dev20261201+cuda", True)])
def test_system_jax_range_is_the_tested_one(version, ok):
  refused = _system_jax().refusal(version)
  assert (refused is None) == ok
  if not ok:
    assert refused.startswith(f"error: CHUNKFORMER_JAX=system: the image's jax {version} is "
                              "outside the tested range 0.10.2..0.11.2")


def test_system_jax_lists_missing_pins_and_leaves_the_images_own_alone():
  lock = ["# comment", "flax==0.12.8", "jax==0.10.2", "jaxlib==0.10.2", "jax-cuda13-plugin==0.11.2",
          "nvidia-cudnn-cu12==9.28.0.42", "ml_collections==1.1.0", "tensorboardX==2.6.5",
          "Orbax_Checkpoint==0.12.8"]
  installed = {"flax", "orbax-checkpoint"}  # at any version: the image's is kept
  assert _system_jax().missing(lock, installed) == ["ml_collections==1.1.0", "tensorboardX==2.6.5"]


def test_h200_lock_records_the_stack_its_figures_name():
  import json

  env = json.loads((ROOT / "bench/results/accelerator_nvidia-h200.json").read_text())["environment"]
  pins = dict(x.split("==") for x in (ROOT / "requirements-h200.lock").read_text().splitlines()
              if x and not x.startswith("#"))
  assert pins["jax"] == pins["jaxlib"] == pins["jax-cuda13-plugin"] == "0.11.2"
  assert "jax/jaxlib 0.11.2 (cuda13 plugin)" in env
  for name in ("flax", "optax", "chex", "orbax-checkpoint", "numpy", "ml_collections",
               "tensorboardX"):
    assert f"{name} {pins[name]}" in env, name
