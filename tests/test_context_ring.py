"""mesh.context_strategy = ring: full attention's K/V passed round the context devices, with and
without the causal load balancing, computes what one device computes and sends what
docs/context_parallel.md states.

One fresh process with 8 fake CPU devices (tests/ring_worker.py) runs the ring attention alone
(GQA, documents across the shard edges; natural on context 2 x tensor 4, load-balanced on
data 2 x context 4 in uneven tiles of queries and on context 8), its custom VJP's gradients
included, and reads the optimised HLO of its forward and backward on context = 4: the suite's
quick case (about 25 s of CPU time). With CHUNKFORMER_SLOW_TESTS=1: the attention on every one
of those meshes in both layouts, and against JAX's autodiff of the forward ring; the model case
(a two-layer full model's loss and gradients on context 2, 4, 8 alone, with data 2 and on
fsdp 2 x context 2 x tensor 2, each with and without load balancing, and a one-layer model's
HLO), minutes of compiles.
"""

import json
import os
from collections import Counter

import numpy as np
import pytest

from chunkformer import config as config_lib
from chunkformer.attention import load_balance
from chunkformer.config import ConfigError
from configs import smoke
from tests import context_parallel_worker as cp
from tests import fake_devices
from tests import ring_worker as worker
from tests.test_sharding import _context_config

TIMEOUT_S = 1800  # the model case: 13 meshes, each two passes of the ring to compile

slow = pytest.mark.skipif(
    os.environ.get("CHUNKFORMER_SLOW_TESTS") != "1",
    reason="4-6 minutes of compiles (thirteen meshes of a two-layer step, two HLO reads; the "
           "attention on every layout); CHUNKFORMER_SLOW_TESTS=1 runs it (the suite runs the "
           "quick attention case)")


def _run_worker(base, *flags):
  out, hlo = base / "arrays.npz", base / "collectives.json"
  fake_devices.run([worker.__file__, "--out", out, "--hlo", hlo, *flags], devices=8,
                   timeout=TIMEOUT_S)
  with np.load(out) as arrays, open(hlo) as f:
    return dict(arrays), json.load(f)


@pytest.fixture(scope="module")
def attention_run(tmp_path_factory):
  return _run_worker(tmp_path_factory.mktemp("ring_attention"))


@pytest.fixture(scope="module")
def every_attention_run(tmp_path_factory):
  return _run_worker(tmp_path_factory.mktemp("ring_attention_all"), "--all_cases")


@pytest.fixture(scope="module")
def model_run(tmp_path_factory):
  return _run_worker(tmp_path_factory.mktemp("ring_model"), "--model")


def _f32(collectives, op):
  return Counter(tuple(c["shape"]) for c in collectives if c["op"] == op and c["dtype"] == "f32")


def _assert_equal_to_reference(arrays, case):
  for name in ("o", "dq", "dk", "dv"):
    want = arrays[f"reference/{name}"]
    assert np.abs(want).max() > 1e-3, name  # every gradient reaches the inputs
    np.testing.assert_allclose(arrays[f"{case}/{name}"], want, atol=1e-5, rtol=0,
                               err_msg=f"{case} {name}")


@pytest.mark.parametrize("case", worker.QUICK_CASES,
                         ids=lambda case: worker.case_name(*case))
def test_ring_attention_and_its_gradients_equal_one_device(attention_run, case):
  """Context 2 x tensor 4 in the natural layout with the query heads split and the kv heads
  whole (GQA across the split); data 2 x context 4 load-balanced, hops cut into tiles of 3
  queries; context 8 load-balanced. The gradients are the custom VJP's."""
  _assert_equal_to_reference(attention_run[0], worker.case_name(*case))


def test_ring_sends_kv_blocks_round_the_ring_and_gathers_nothing(attention_run):
  """n - 1 = 3 hops, each a collective-permute of a device's K and V blocks [B, T/n, K, D]
  and of its document ids (int32 [B, T/n]); no all-gather, no all-reduce."""
  _, hlo = attention_run
  n = 4
  ring = hlo["ring"]
  assert _f32(ring, "collective-permute") == Counter(
      {(worker.B, worker.HLO_T // n, worker.K, worker.D): 2 * (n - 1)})
  ids = Counter(tuple(c["shape"]) for c in ring if c["dtype"] == "s32")
  assert ids == Counter({(worker.B, worker.HLO_T // n): n - 1})
  assert not [c for c in ring if c["op"] in ("all-gather", "all-reduce", "all-to-all")]


def test_ring_backward_brings_dkv_home_in_n_hops(attention_run):
  """Forward and backward in one step: 2 (n - 1) collective-permutes of K/V blocks and 2 n of
  their float32 gradients (each block's dK/dV travel with it and return home after n hops),
  all [B, T/n, K, D]; n - 1 of the document ids. XLA sends each K/V block once: the backward's
  second pass shares the forward's identical collective-permutes. No all-gather, no
  all-reduce: nothing is gathered or summed over the ring."""
  _, hlo = attention_run
  n, block = 4, (worker.B, worker.HLO_T // 4, worker.K, worker.D)
  both = hlo["ring_backward"]
  sends = Counter((c["dtype"], tuple(c["shape"])) for c in both if c["op"] == "collective-permute")
  assert sends == Counter({("f32", block): 2 * (n - 1) + 2 * n, ("s32", block[:2]): n - 1})
  assert not [c for c in both if c["op"] != "collective-permute"]


@slow
def test_ring_attention_equals_one_device_and_autodiff_in_every_layout(every_attention_run):
  """Context 2, 4 and 8, each natural and load-balanced; and JAX's autodiff of the forward ring
  (every hop's blocks kept) gives the custom VJP's gradients."""
  arrays, _ = every_attention_run
  for case in worker.ATTENTION_CASES:
    _assert_equal_to_reference(arrays, worker.case_name(*case))
  for case in worker.AUTODIFF_CASES:
    _assert_equal_to_reference(arrays, worker.case_name(*case, backward="autodiff"))
    for name in ("dq", "dk", "dv"):
      np.testing.assert_allclose(arrays[worker.case_name(*case, backward="autodiff") + f"/{name}"],
                                 arrays[worker.case_name(*case) + f"/{name}"], atol=1e-5, rtol=0,
                                 err_msg=f"{case} {name}")


@pytest.mark.parametrize("n", [2, 4, 8])
def test_load_balancing_gives_every_device_the_same_causal_work(n):
  """Device d holds chunks d and 2n-1-d of c tokens: its queries see c*c*(2n-1) + c*(c+1)
  earlier-or-equal keys, whatever d; in the natural layout (chunks 2d, 2d+1) it is
  (2d+1)*2c*c + c, growing with d."""
  t, c = 48, 48 // (2 * n)
  held = [np.asarray(load_balance.token_index(d, n, t // n, balanced=True)) for d in range(n)]
  np.testing.assert_array_equal(np.sort(np.concatenate(held)), np.arange(t))  # a permutation
  work = [int(np.sum(idx + 1)) for idx in held]  # query at row index i sees keys 0..i
  assert work == [c * c * (2 * n - 1) + c * (c + 1)] * n
  natural = [int(np.sum(np.asarray(load_balance.token_index(d, n, t // n, balanced=False)) + 1))
             for d in range(n)]
  assert natural == [(2 * d + 1) * 2 * c * c + c for d in range(n)]


def _config(**fields):
  """The smoke config on mesh.context = 4, ring, with dotted ``fields`` overridden."""
  return _context_config({"mesh.context_strategy": "ring", **fields})


@pytest.mark.parametrize(("fields", "field"), [
    ({"mesh.context": 1}, "'mesh.context_strategy'"),  # nothing to pass round
    ({"mesh.context_strategy": "rings"}, "'mesh.context_strategy'"),
    ({"mesh.context_strategy": "all_gather", "mesh.context_load_balance": True},
     "'mesh.context_load_balance'"),
    ({"mesh.context_load_balance": True, "data.seq_len": 36}, "'data.seq_len'"),  # 36 % 8
    ({"mesh.context_load_balance": True, "model.layer_pattern": "kind=fixed;kind=full"},
     r"'model.attention\[layer 0\].kind'"),
    ({"mesh.context_load_balance": True, "model.key_shift": 2}, "'model.key_shift'"),
    ({"mesh.axis_rules": (("batch", "data"), ("length", ("context", "tensor")))},
     "'mesh.axis_rules'"),  # the ring runs along one axis
    ({"model.attention.implementation": "blockwise"},
     r"'model.attention\[layer 0\].implementation'"),
])
def test_ring_refuses_what_it_cannot_run_before_compiling(fields, field):
  with pytest.raises(ConfigError, match=field):
    config_lib.from_dict(_config(**fields))
  config_lib.from_dict(_config(**{"mesh.context_load_balance": True}))  # smoke: 32 % 8 == 0


@slow
@pytest.mark.parametrize("balanced", [False, True], ids=["ring", "ring_balanced"])
@pytest.mark.parametrize("mesh", worker.MODEL_MESHES, ids=lambda m: "x".join(map(str, m)))
def test_ring_model_loss_and_gradients_equal_one_device(model_run, mesh, balanced):
  arrays, _ = model_run
  name = "x".join(map(str, mesh)) + ("/balanced" if balanced else "")
  reference = {k.removeprefix("1x1x1x1/"): v for k, v in arrays.items()
               if k.startswith("1x1x1x1/")}
  assert len(reference) > 10 and abs(float(reference["loss"])) > 0.1
  for key, value in reference.items():
    np.testing.assert_allclose(arrays[f"{name}/{key}"], value, atol=1e-5, rtol=0, err_msg=key)


@slow
def test_ring_model_forward_sends_kv_blocks_and_no_all_gather_of_them(model_run):
  """docs/context_parallel.md's ring rows: a one-layer full model on context = 4 (T = 384, one
  kv head) sends K and V in 3 hops of [B, T/4, 1, D] each and all-gathers no float array;
  load balancing adds two collective-permutes of [B, T/8, E] for the hidden states' way back
  (and six of int32 [B, T/8]: tokens, positions and document ids on the way in)."""
  _, hlo = model_run
  b, t, d = cp.BATCH, cp.HLO_SEQ_LEN, cp.HEAD_DIM
  plain, balanced = hlo["ring_balanced=False"], hlo["ring_balanced=True"]
  assert _f32(plain, "collective-permute") == Counter({(b, t // 4, 1, d): 6})
  width = config_lib.from_dict(smoke.get_config().to_dict()).model.d_model
  assert _f32(balanced, "collective-permute") == Counter({(b, t // 4, 1, d): 6,
                                                          (b, t // 8, width): 2})
  ints = Counter(tuple(c["shape"]) for c in balanced if c["dtype"] == "s32")
  assert ints == Counter({(b, t // 4): 3, (b, t // 8): 6})
  for collectives in (plain, balanced):
    assert not _f32(collectives, "all-gather") and not _f32(collectives, "all-reduce")
