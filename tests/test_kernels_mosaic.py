"""The Mosaic GPU forward of chunk_attention (``AttentionBlockSizes(forward="mosaic")``) against
the dense reference, in the Mosaic GPU interpreter (TMA, barriers, warpgroup MMA on CPU), with
the Triton backward reading its lse; its tile bounds; and its refusals.

The interpreter runs each warpgroup as an XLA CPU computation started from its own Python
thread, and its grid loop's thread-map callback holds one of XLA's CPU worker threads while they
run; a warpgroup at a barrier holds one too. XLA sizes its CPU pools to the cores, so on 2 cores
the interpreter deadlocked now and then (every thread waiting on a futex, none running): under
xdist 4 of 9 runs of this file, 1 of 2 beside a training run, and pinned to one core with the
call's input still being computed 1 of 1. More XLA threads (``PJRT_NPROC=8``, which conftest.py
sets) stop it: that pinned call finished (47.5 s; without it, it hung again), and xdist runs of
this file beside a training run passed 8 of 8 (6 on 2 cores, 92-101 s; 2 pinned to one core,
147-148 s). ``attention_mgpu.check_interpreter_threads`` refuses to start the interpreter with
fewer threads than warpgroups + 1."""

from __future__ import annotations

import types

import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels import attention_mgpu, layout
from tests import kernel_cases as kc

TOL = dict(atol=2e-2, rtol=2e-2)
MOSAIC = kernels.AttentionBlockSizes(forward="mosaic")


# bf16 and f16; MQA, GQA and one head per kv head; padded T, C and head dims (40 -> 64); entries
# only (window 0: early queries see nothing) and a window longer than the row; fixed and
# dynamic ends over several documents; one and two consumer warpgroups, 64- and 128-key blocks,
# rings of two and three slots, fewer entries than a block (capacity 9), a row of 30 tokens.
CASES = [
    dict(t=200, h=2, kh=1, d=64, window=32, m=4, docs=2, sink=True, dtype=jnp.bfloat16,
         tiles=MOSAIC),
    dict(t=130, h=4, kh=2, d=40, window=0, m="dynamic", docs=3, sink=False, dtype=jnp.float16,
         tiles=MOSAIC),
    dict(t=160, h=2, kh=2, d=64, window=300, m=8, docs=1, sink=True, dtype=jnp.bfloat16,
         tiles=kernels.AttentionBlockSizes(block_q=64, block_k=128, block_c=128, num_stages=3,
                                           forward="mosaic")),
    dict(t=30, h=2, kh=1, d=64, window=7, m="dynamic", docs=2, sink=True, dtype=jnp.bfloat16,
         tiles=MOSAIC, capacity=9),  # a row shorter than the tiles: clamped to 64 x 64
]


def _case_id(c):
  return f"T{c['t']}H{c['h']}K{c['kh']}D{c['d']}W{c['window']}M{c['m']}"


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_mosaic_forward_matches_reference_with_gradients(case):
  case = dict(case)
  tiles, window = case.pop("tiles"), case["window"]
  args, kw = kc.attention_case(0, b=2, **case)
  ct = jnp.asarray(np.random.default_rng(1).standard_normal(args[0].shape), jnp.float32)
  got_o, got_g = kc.attention_with_grads("pallas_gpu", window, tiles)(*args, kw["sink_H"], ct)
  want_o, want_g = kc.attention_with_grads("xla", window, None)(*args, kw["sink_H"], ct)
  assert got_o.dtype == case["dtype"]
  np.testing.assert_allclose(np.asarray(got_o, np.float32), np.asarray(want_o, np.float32),
                             **TOL, err_msg="output")
  for name, a, b in zip(("dq", "dk", "dv", "d_entry_k", "d_entry_v", "d_sink"), got_g, want_g,
                        strict=True):
    if b is not None:
      np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), **TOL,
                                 err_msg=name)


def test_mosaic_forward_never_shows_an_entry_whose_id_is_not_its_ends_document():
  # An entry per token of one document: entry block 0 is interior for the second 64-row tile,
  # but entry 5 carries another document's id, so its bias column (-inf) must hide it there.
  args, kw = kc.attention_case(0, t=128, h=2, kh=1, d=64, m=1, docs=1, window=4,
                               dtype=jnp.bfloat16)
  args = args[:7] + (args[7].at[0, 5].set(99),)
  got = kernels.chunk_attention(*args, **kw, implementation="pallas_gpu", interpret=True,
                                block_sizes=MOSAIC)
  want = kernels.chunk_attention(*args, **kw, implementation="xla")
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), **TOL)
  shown = kernels.chunk_attention(*args[:7], args[7].at[0, 5].set(0), **kw,
                                  implementation="xla")
  assert float(jnp.abs(shown.astype(jnp.float32) - want.astype(jnp.float32))[0, 64:].max()) > 0.1


def test_mosaic_forward_lse_is_the_triton_forwards():
  # The backward reads the forward's lse: the Mosaic one must hand it over in the Triton
  # forward's units (natural log) and layout (B x H x Tp), rows that see nothing at 0.
  from kernels import attention_gpu

  args, kw = kc.attention_case(3, b=1, t=128, h=2, kh=1, d=64, m=4, docs=2, window=0,
                               sink=False, dtype=jnp.bfloat16)
  captured = {}
  forward = attention_gpu._any_forward

  def spy(cfg, *a):
    captured[cfg.mosaic_fwd] = forward(cfg, *a)[1]
    return forward(cfg, *a)

  for tiles in (MOSAIC, kernels.AttentionBlockSizes()):
    attention_gpu._any_forward, saved = spy, attention_gpu._any_forward
    try:
      kernels.chunk_attention(*args, **kw, implementation="pallas_gpu", interpret=True,
                              block_sizes=tiles)
    finally:
      attention_gpu._any_forward = saved
  assert captured[True].shape == captured[False].shape == (1, 2, 128)
  np.testing.assert_allclose(np.asarray(captured[True]), np.asarray(captured[False]),
                             atol=2e-2)
  assert float(jnp.abs(captured[True][0, :, 0]).max()) == 0.0  # query 0 sees no entry


def test_mosaic_forward_has_no_races():
  from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

  args, kw = kc.attention_case(2, b=1, t=256, h=1, kh=1, d=64, m=4, docs=2, window=40,
                               sink=True, dtype=jnp.bfloat16)
  o = kernels.chunk_attention(*args, **kw, implementation="pallas_gpu",
                              interpret=InterpretGPUParams(detect_races=True),
                              block_sizes=MOSAIC)
  np.testing.assert_allclose(np.asarray(o, np.float32),
                             np.asarray(kernels.chunk_attention(*args, **kw), np.float32), **TOL)
  assert not interpret_pallas_call.get_races().races_found


def test_tile_bounds_cover_exactly_the_visible_blocks():
  # Per 64-row tile: the blocks [lo, hi) are those holding a visible key of some row, and the
  # interior [a, z) those every row sees in full, for a window and for the entry ranges.
  rng = np.random.default_rng(0)
  seg = jnp.asarray(kc.segment_ids(rng, 1, 256, 3))
  ends = jnp.asarray(kc.end_flags(rng, np.asarray(seg), "dynamic"))
  cs = layout.chunk_structure(ends, seg, 256)
  kvlo = layout.raw_key_start(seg, 40)
  elo, ehi = layout.visible_entry_range(cs.entry_ends_BxC, cs.entry_segment_ids_BxC, seg)
  bounds = np.asarray(attention_mgpu.tile_bounds(kvlo, elo, ehi, 40, 64))[0]
  kvlo, elo, ehi = (np.asarray(x)[0] for x in (kvlo, elo, ehi))
  for tile in range(4):
    rows = np.arange(tile * 64, tile * 64 + 64)
    raw = [(kvlo[t] <= np.arange(256)) & (np.arange(256) <= t) for t in rows]
    ent = [(elo[t] <= np.arange(256)) & (np.arange(256) < ehi[t]) for t in rows]
    for vis, lo, hi, a, z in ((raw, *bounds[tile, :4]), (ent, *bounds[tile, 4:])):
      blocks = np.stack(vis).reshape(64, 4, 64)
      needed = np.flatnonzero(blocks.any(axis=(0, 2)))
      full = np.flatnonzero(blocks.all(axis=(0, 2)))
      if needed.size:  # the range starts and ends at a needed block
        assert (lo, hi) == (needed[0], needed[-1] + 1), (tile, lo, hi, needed)
      else:
        assert lo == hi, (tile, lo, hi)
      assert set(range(a, z)) <= set(full), (tile, a, z, full)
  # No window: no raw-key step in any tile (a program walks the union of its tiles' ranges).
  assert not np.asarray(attention_mgpu.tile_bounds(*(jnp.asarray(x)[None] for x in (
      kvlo, elo, ehi)), 0, 64))[0, :, :4].any()


def test_mosaic_forward_refuses_what_it_cannot_run():
  args, kw = kc.attention_case(0, b=1, t=64, h=2, kh=1, d=64, dtype=jnp.float32)
  with pytest.raises(ValueError, match="bfloat16 or float16.*got float32"):
    kernels.chunk_attention(*args, **kw, implementation="pallas_gpu", interpret=True,
                            block_sizes=MOSAIC)
  with pytest.raises(ValueError, match=r"block_q and block_k in \(64, 128\)"):
    kernels.AttentionBlockSizes(block_q=32, forward="mosaic")
  with pytest.raises(ValueError, match="forward must be one of"):
    kernels.AttentionBlockSizes(forward="cutlass")
  ampere = types.SimpleNamespace(compute_capability="8.0", device_kind="NVIDIA A100-SXM4-80GB")
  with pytest.raises(ValueError, match="Hopper or later GPU.*A100-SXM4-80GB has 8.0"):
    attention_mgpu.check_device(ampere)
  attention_mgpu.check_device(types.SimpleNamespace(compute_capability="9.0", device_kind="H"))


def test_mosaic_interpreter_refuses_too_few_xla_threads(monkeypatch):
  # 128-row programs run two consumer warpgroups and the producer, which need 4 XLA CPU
  # threads: with 3 the call could deadlock, so it is refused before anything compiles, naming
  # the variable that fixes it.
  args, kw = kc.attention_case(0, b=1, t=128, h=2, kh=1, d=64, dtype=jnp.bfloat16)
  two_consumers = kernels.AttentionBlockSizes(block_q=128, forward="mosaic")
  monkeypatch.setenv("PJRT_NPROC", "3")
  with pytest.raises(ValueError, match="runs 3 warpgroups and needs at least 4 XLA CPU threads, "
                                       "but this process has 3: set PJRT_NPROC=8"):
    kernels.chunk_attention(*args, **kw, implementation="pallas_gpu", interpret=True,
                            block_sizes=two_consumers)
  monkeypatch.setenv("PJRT_NPROC", "4")
  assert attention_mgpu.xla_cpu_threads() == 4
  attention_mgpu.check_interpreter_threads(3)
