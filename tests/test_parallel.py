"""Sharded training computes the same thing as one device, within and across processes.

Each run is a fresh process (tests/parallel_worker.py): the fake device count and
``jax.distributed`` must be set before JAX starts. All runs start together and share a
compilation cache; the model is the smoke config with one KV head, so the mesh's ``tensor``
axis is dropped for ``kv_heads`` (it cannot split 1) while it still splits heads and MLP.
"""

import glob
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "parallel_worker.py")
TIMEOUT_S = 300


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """name -> (worker JSON, workdir) for: one device; 8 fake devices; 2 processes x 2 devices;
  2 processes x 4 devices with every row's tokens split over all 8 (mesh.context = 8)."""
  base = tmp_path_factory.mktemp("parallel")
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
             JAX_COMPILATION_CACHE_DIR=str(base / "jax_cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  port = _free_port()
  specs = {
      "one_device": ({"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}, "1,1,1"),
      "eight_devices": ({"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}, "2,2,2"),
  }
  for pid in range(2):
    specs[f"process_{pid}"] = ({
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "CHUNKFORMER_COORDINATOR": f"127.0.0.1:{port}", "CHUNKFORMER_NUM_PROCESSES": "2",
        "CHUNKFORMER_PROCESS_ID": str(pid)}, "2,1,2")
  context_port = _free_port()
  for pid in range(2):  # tokens 0-15 of every row on process 0's devices, 16-31 on process 1's
    specs[f"context_process_{pid}"] = ({
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
        "CHUNKFORMER_COORDINATOR": f"127.0.0.1:{context_port}",
        "CHUNKFORMER_NUM_PROCESSES": "2", "CHUNKFORMER_PROCESS_ID": str(pid)}, "1,1,1,8")
  procs = {}
  for name, (extra, mesh) in specs.items():
    workdir = str(base / ("two_processes" if name.startswith("process") else
                          "context_processes" if name.startswith("context_process") else name))
    out = str(base / f"{name}.json")
    log = open(base / f"{name}.log", "w")  # noqa: SIM115 -- closed below
    cmd = [sys.executable, WORKER, "--out", out, "--workdir", workdir, "--mesh", mesh]
    procs[name] = (subprocess.Popen(cmd, env=dict(env, **extra), stdout=log, stderr=log,
                                    cwd=ROOT), out, workdir, log)
  results = {}
  for name, (proc, out, workdir, log) in procs.items():
    try:
      rc = proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
      proc.kill()
      rc = "timeout"
    log.close()
    assert rc == 0, f"{name} failed ({rc}):\n{open(log.name).read()[-4000:]}"
    if os.path.exists(out):
      with open(out) as f:
        results[name] = (json.load(f), workdir)
  return results


def test_eight_fake_devices_match_one_device(runs):
  one, _ = runs["one_device"]
  eight, _ = runs["eight_devices"]
  assert (one["devices"], eight["devices"]) == (1, 8)
  assert len(one["losses"]) == 3
  np.testing.assert_allclose(eight["losses"], one["losses"], atol=1e-5, rtol=0)
  np.testing.assert_allclose(eight["final"]["heldout"]["loss"], one["final"]["heldout"]["loss"],
                             atol=1e-5, rtol=0)


def test_two_processes_match_one_process(runs):
  one, _ = runs["one_device"]
  two, workdir = runs["process_0"]
  assert "process_1" not in runs  # only process 0 writes results
  assert (two["processes"], two["devices"]) == (2, 4)
  np.testing.assert_allclose(two["losses"], one["losses"], atol=1e-5, rtol=0)
  np.testing.assert_allclose(two["final"]["heldout"]["loss"], one["final"]["heldout"]["loss"],
                             atol=1e-5, rtol=0)
  # Only process 0 writes metrics; both wrote their shards of the shared checkpoint.
  assert len(glob.glob(os.path.join(workdir, "events.out.tfevents.*"))) == 1
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2", "3"]


def test_context_axis_across_two_processes_matches_one_process(runs):
  one, _ = runs["one_device"]
  two, workdir = runs["context_process_0"]
  assert "context_process_1" not in runs
  assert (two["processes"], two["devices"]) == (2, 8)
  np.testing.assert_allclose(two["losses"], one["losses"], atol=1e-5, rtol=0)
  np.testing.assert_allclose(two["final"]["heldout"]["loss"], one["final"]["heldout"]["loss"],
                             atol=1e-5, rtol=0)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2", "3"]
