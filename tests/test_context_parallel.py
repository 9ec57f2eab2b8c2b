"""Context parallelism (mesh.context): one row's tokens split over devices computes what one
device computes, for every attention kind, and its communication is what docs/context_parallel.md
states.

One fresh process with 8 fake CPU devices (tests/context_parallel_worker.py) computes the
training loss and gradients of a model with one layer per kind (full; fixed plain, overlapping
and with the paper's general windows W6/S4 and W10/S4; DeepSeek-V4 layout with the lightning
indexer's top-k; dynamic with router and with delimiter) on one device and on context = 8, data
2 x context 4, fsdp 2 x context 2 x tensor 2, for a batch whose documents cross the shard edges
and whose chunks of 4 straddle them (6 tokens per shard at context = 8). It also reads the
optimised HLO of one layer's forward under context = 4 for the full and the fixed kind and
checks the communication the doc states.

Its compiles (four meshes of an eight-layer step, two HLO reads) cost about 70 s on quiet cores
(94 s beside the rest of the suite, empty compile cache) with XLA's backend optimisations off
(tests/conftest.py). The config refusals: tests/test_sharding.py.
"""

import json
from collections import Counter

import numpy as np
import pytest

from tests import context_parallel_worker as worker
from tests import fake_devices

TIMEOUT_S = 600
REFERENCE = "1x1x1x1"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """(arrays of the worker's npz, collectives per kind) of its one run."""
  base = tmp_path_factory.mktemp("context_parallel")
  out, hlo = base / "grads.npz", base / "collectives.json"
  fake_devices.run([worker.__file__, "--out", out, "--hlo", hlo], devices=8, timeout=TIMEOUT_S)
  with np.load(out) as arrays:
    arrays = dict(arrays)
  with open(hlo) as f:
    return arrays, json.load(f)


def _assert_equal_to_one_device(arrays, mesh, num_layers):
  name = "x".join(map(str, mesh))
  reference = {k.removeprefix(REFERENCE + "/"): v for k, v in arrays.items()
               if k.startswith(REFERENCE + "/")}
  assert len(reference) > 5 * num_layers  # the loss and every parameter's gradient
  for layer in range(num_layers):  # each kind's own layer got a nonzero gradient
    assert np.abs(reference[f"grad['block_{layer}']['attn_norm']['scale']"]).max() > 1e-6
  np.testing.assert_allclose(arrays[f"{name}/loss"], reference["loss"], atol=1e-5, rtol=0)
  for key, value in reference.items():
    np.testing.assert_allclose(arrays[f"{name}/{key}"], value, atol=1e-5, rtol=0, err_msg=key)


@pytest.mark.parametrize("mesh", worker.MESHES, ids=lambda m: "x".join(map(str, m)))
def test_context_parallel_loss_and_gradients_equal_one_device(run, mesh):
  _assert_equal_to_one_device(run[0], mesh, len(worker.LAYERS))


def _f32(collectives, op):
  """Counter of the result shapes of the float collectives ``op``."""
  return Counter(tuple(c["shape"]) for c in collectives if c["op"] == op and c["dtype"] == "f32")


def test_full_attention_all_gathers_keys_and_values(run):
  """docs/context_parallel.md: full attention all-gathers K and V whole ([B, T, Hkv, D] each)
  and moves no other floats."""
  _, hlo = run
  b, t, d = worker.BATCH, worker.HLO_SEQ_LEN, worker.HEAD_DIM
  assert _f32(hlo["full"], "all-gather") == Counter({(b, t, 1, d): 2})
  assert not _f32(hlo["full"], "collective-permute") and not _f32(hlo["full"], "all-reduce")


def test_fixed_kind_sends_a_window_halo_and_all_gathers_only_the_entries(run):
  """docs/context_parallel.md: the fixed kind sends each shard the previous W keys and values
  (collective-permutes of W tokens) and all-gathers the T/S entries; no raw-token float array
  is all-gathered, so it moves (2W + T/S) x D floats per row and kv head, full 2T x D."""
  _, hlo = run
  b, t, d = worker.BATCH, worker.HLO_SEQ_LEN, worker.HEAD_DIM
  w, s = worker.WINDOW, worker.STRIDE
  assert _f32(hlo["fixed"], "all-gather") == Counter({(b, 1, t // s, d): 1})
  assert _f32(hlo["fixed"], "collective-permute") == Counter({(b, 1, 1, w, d): 2})
  assert not _f32(hlo["fixed"], "all-reduce")
