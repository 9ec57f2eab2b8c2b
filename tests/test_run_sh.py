"""run.sh's JAX flavours (CHUNKFORMER_JAX), checked with its dry run: nothing is installed."""

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(tmp_path, *args, flavour=None, dry=True):
  env = {k: v for k, v in os.environ.items() if k != "CHUNKFORMER_JAX"}
  env["CHUNKFORMER_VENV"] = str(tmp_path / "venv")
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
    ("rocm", "demo", "error: CHUNKFORMER_JAX=rocm: expected cpu (default), cuda12 or tpu"),
    ("cpu", "bench", "usage: [CHUNKFORMER_JAX=cpu|cuda12|tpu] ./run.sh {demo|test|python ...}"),
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
