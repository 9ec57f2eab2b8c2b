"""Pallas kernels (interpret mode on CPU) against the references: outputs and gradients.

Chunk layouts (M in {1, 3, 4, 8}, dynamic ends, documents in a row) are data, not shapes, so
each test compiles a kernel once per shape and runs every layout through it: broad coverage at
the price of a few compilations (interpret-mode compiles dominate the run time).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

import kernels
from tests import kernel_cases as kc

LAYOUTS = [(1, 1), (3, 2), (4, 3), (8, 2), ("dynamic", 3), ("dynamic", 1)]  # (M, documents)
TOL = {jnp.float32: dict(atol=1e-5, rtol=1e-5), jnp.bfloat16: dict(atol=2e-2, rtol=2e-2)}
SMALL_GPU = kernels.AttentionBlockSizes(block_q=16, block_k=16, block_c=16, block_q_bwd=16,
                                        block_k_bwd=16, block_c_bwd=16)
SMALL_TPU = kernels.AttentionBlockSizes(block_q=8, block_k=16, block_c=8)



def _check_attention(implementation, block_sizes, *, t, h, kh, d, window, sink, dtype,
                     capacity=None):
  kernel = kc.attention_with_grads(implementation, window, block_sizes)
  reference = kc.attention_with_grads("xla", window, None)
  for seed, (m, docs) in enumerate(LAYOUTS):
    args, kw = kc.attention_case(seed, b=2, t=t, h=h, kh=kh, d=d, m=m, docs=docs, window=window,
                                 capacity=capacity, dtype=dtype, sink=sink)
    ct = jnp.asarray(np.random.default_rng(seed).standard_normal(args[0].shape), jnp.float32)
    got_o, got_g = kernel(*args, kw["sink_H"], ct)
    want_o, want_g = reference(*args, kw["sink_H"], ct)
    assert np.isfinite(np.asarray(got_o, np.float32)).all(), (m, docs)
    np.testing.assert_allclose(np.asarray(got_o, np.float32), np.asarray(want_o, np.float32),
                               **TOL[dtype], err_msg=f"output, M={m}, docs={docs}")
    names = ("dq", "dk", "dv", "d_entry_k", "d_entry_v", "d_sink")
    for name, a, b in zip(names, got_g, want_g, strict=True):
      if b is None:
        continue
      assert np.isfinite(np.asarray(a, np.float32)).all(), (name, m, docs)
      np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                 **TOL[dtype], err_msg=f"{name}, M={m}, docs={docs}")


# Odd lengths and head dims (padding), GQA ratios 1/2/4 and MQA with 3 heads, entries only
# (window 0, so early queries see nothing), a window longer than the row, bf16; small tiles so
# that blocks are really skipped.
GPU_CASES = [
    dict(t=37, h=3, kh=1, d=12, window=5, sink=True, dtype=jnp.float32),  # MQA, 3 heads, odd D
    dict(t=48, h=4, kh=2, d=32, window=0, sink=False, dtype=jnp.float32),
    dict(t=29, h=4, kh=4, d=16, window=40, sink=True, dtype=jnp.float32, capacity=9),
    dict(t=40, h=8, kh=2, d=16, window=7, sink=False, dtype=jnp.bfloat16),
]


def _case_id(c):
  return f"T{c['t']}H{c['h']}K{c['kh']}W{c['window']}"


@pytest.mark.parametrize("case", GPU_CASES, ids=_case_id)
def test_pallas_gpu_attention_matches_reference_with_gradients(case):
  _check_attention("pallas_gpu", SMALL_GPU, **case)


@pytest.mark.parametrize("h,kh,dtype", [(4, 2, jnp.float32), (8, 2, jnp.float32),
                                         (6, 2, jnp.float32), (4, 2, jnp.bfloat16)],
                         ids=["G2", "G4", "G3", "G2bf16"])
def test_pallas_gpu_attention_one_program_per_kv_head_matches_reference(h, kh, dtype):
  # 64-row query tiles: G = 2 and 4 run one forward program per kv head (32 and 16 tokens x
  # G heads per tile); G = 3 (not a power of two) keeps one program per head.
  from kernels import attention_gpu

  tiles = kernels.AttentionBlockSizes(block_q=64, block_k=16, block_c=16, block_q_bwd=16,
                                      block_k_bwd=16, block_c_bwd=16)
  cfg = attention_gpu._config(tiles, 40, 7, 1.0, h // kh, True)
  assert (cfg.fwd_group, cfg.bq_fwd) == {2: (2, 32), 4: (4, 16), 3: (1, 64)}[h // kh]
  _check_attention("pallas_gpu", tiles, t=40, h=h, kh=kh, d=16, window=7, sink=True,
                   dtype=jnp.float32)


@pytest.mark.parametrize("h,kh,block_q", [(4, 2, 64), (3, 1, 16)], ids=["G2rows", "G3heads"])
def test_pallas_gpu_fused_backward_matches_reference(h, kh, block_q):
  # The FlashAttention-2 backward: the dk/dv kernels add dq by atomics (no dq kernel), with the
  # group's heads as rows (G = 2) and with the serial loop over heads (G = 3).
  tiles = kernels.AttentionBlockSizes(block_q=block_q, block_k=16, block_c=16, block_q_bwd=16,
                                      block_k_bwd=16, block_c_bwd=16, backward="fused")
  _check_attention("pallas_gpu", tiles, t=40, h=h, kh=kh, d=16, window=7, sink=True,
                   dtype=jnp.float32)


@pytest.mark.parametrize("implementation,tiles", [("pallas_gpu", SMALL_GPU),
                                                   ("pallas_tpu", SMALL_TPU)])
def test_pallas_attention_with_a_precomputed_row_layout_is_the_same(implementation, tiles):
  # The model hands every layer kernels.row_layout(segment ids) computed once per step.
  args, kw = kc.attention_case(1, b=2, t=40, h=4, kh=2, d=16, m=3, docs=3, window=7,
                               sink=True, dtype=jnp.float32)
  seg = args[3]

  def run(row_layout):
    loss = lambda q, k, v, ek, ev: jnp.sum(jnp.sin(kernels.chunk_attention(
        q, k, v, seg, ek, ev, *args[6:], **kw, implementation=implementation, interpret=True,
        block_sizes=tiles, row_layout=row_layout)))
    return jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4))(*args[:3], *args[4:6])

  (got, got_g), (want, want_g) = run(kernels.row_layout(seg)), run(None)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  for a, b in zip(got_g, want_g, strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("implementation,block_sizes", [
    ("pallas_gpu", SMALL_GPU), ("pallas_gpu", dataclasses.replace(SMALL_GPU, backward="fused")),
    ("pallas_tpu", SMALL_TPU)], ids=["gpu", "gpu_fused", "tpu"])
def test_pallas_never_shows_an_entry_whose_id_is_not_its_ends_document(implementation,
                                                                       block_sizes):
  # One document, an entry per token, small tiles: entry block 0 is seen in full by every
  # later query block (an interior, unmasked tile), except that entry 5 carries another
  # document's id, so no query may see it. The kernels' key columns give it no queries, which
  # makes every tile holding it a boundary tile.
  args, kw = kc.attention_case(0, t=64, m=1, docs=1, window=4, dtype=jnp.float32)
  args = args[:7] + (args[7].at[0, 5].set(99),)
  ct = jnp.asarray(np.random.default_rng(1).standard_normal(args[0].shape), jnp.float32)
  got_o, got_g = kc.attention_with_grads(implementation, 4, block_sizes)(*args, None, ct)
  want_o, want_g = kc.attention_with_grads("xla", 4, None)(*args, None, ct)
  np.testing.assert_allclose(got_o, want_o, **TOL[jnp.float32])
  for a, b in zip(got_g[:5], want_g[:5], strict=True):
    np.testing.assert_allclose(a, b, **TOL[jnp.float32])
  assert float(jnp.abs(got_g[3][0, 5]).max()) == 0.0  # the hidden entry gets no gradient
  valid_o, _ = kc.attention_with_grads("xla", 4, None)(*args[:7], args[7].at[0, 5].set(0),
                                                       None, ct)
  assert float(jnp.abs(valid_o - want_o)[0, 16:].max()) > 1e-3  # the id mattered


def test_pallas_gpu_attention_with_the_hopper_tiles_matches_reference_with_gradients():
  # The per-device table's tiles (128-row forward, 64-row backward) unclamped: T = 160 pads to
  # two 128-row query blocks; a window of 100 gives interior and boundary blocks.
  hopper = kernels.AttentionBlockSizes.gpu("NVIDIA H200")
  assert hopper.block_q == 128 and hopper.block_q_bwd >= 64
  assert kernels.AttentionBlockSizes.gpu("an unknown GPU") == kernels.AttentionBlockSizes()
  _check_attention("pallas_gpu", hopper, t=160, h=4, kh=2, d=16, window=100, sink=True,
                   dtype=jnp.float32)


TPU_CASES = [
    dict(t=37, h=3, kh=1, d=12, window=5, sink=True, dtype=jnp.float32),
    dict(t=32, h=2, kh=2, d=16, window=0, sink=False, dtype=jnp.bfloat16),
]


@pytest.mark.parametrize("case", TPU_CASES, ids=_case_id)
def test_pallas_tpu_attention_matches_reference_with_gradients(case):
  _check_attention("pallas_tpu", SMALL_TPU, **case)


def test_pallas_tpu_attention_has_no_races_under_tpu_interpreter():
  # The TPU interpreter reports races only through this module state (jax 0.10.2, pinned).
  from jax._src.pallas.mosaic.interpret import interpret_pallas_call as tpu_interpreter
  args, kw = kc.attention_case(0, b=1, t=16, h=2, kh=1, d=8, m=4, docs=2, window=3, sink=True)
  params = pltpu.InterpretParams(detect_races=True)
  got = kernels.chunk_attention(*args, **kw, implementation="pallas_tpu", interpret=params,
                                block_sizes=kernels.AttentionBlockSizes(block_q=8, block_k=8,
                                                                        block_c=8))
  np.testing.assert_allclose(got, kernels.chunk_attention(*args, **kw), atol=1e-5)
  assert tpu_interpreter.races is not None and not tpu_interpreter.races.races_found


@functools.cache
def _pool_with_grads(implementation, capacity, block_sizes):
  def run(values, logits, ends, seg, slot_bias, ct):
    def loss(values, logits, slot_bias):
      out = kernels.segment_pool(values, logits, ends, seg, capacity=capacity,
                                 slot_bias_SxN=slot_bias, implementation=implementation,
                                 interpret=True, block_sizes=block_sizes)
      return jnp.sum(out[0].astype(jnp.float32) * ct), out
    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(
        values, logits, slot_bias)
    return out, grads
  return jax.jit(run)


@pytest.mark.parametrize("implementation,block_sizes", [
    ("pallas_gpu", kernels.PoolBlockSizes(block_t=16, block_n=16)),
    ("pallas_tpu", kernels.PoolBlockSizes(block_t=8, block_n=128)),
])
def test_pallas_segment_pool_matches_reference_with_gradients(implementation, block_sizes):
  b, t, n, capacity = 2, 45, 20, 12  # capacity below the chunk count for small M: overflow
  kernel = _pool_with_grads(implementation, capacity, block_sizes)
  reference = _pool_with_grads("xla", capacity, None)
  for seed, (m, docs) in enumerate(LAYOUTS):
    rng = np.random.default_rng(seed)
    seg = jnp.asarray(kc.segment_ids(rng, b, t, docs))
    ends = jnp.asarray(kc.end_flags(rng, np.asarray(seg), m))
    f = lambda *s, rng=rng: jnp.asarray(rng.standard_normal(s), jnp.float32)
    args = (f(b, t, n), 3 * f(b, t, n), ends, seg, f(4, n), f(b, capacity, n))
    (got, got_g), (want, want_g) = kernel(*args), reference(*args)
    for a, w in zip(got + got_g, want + want_g, strict=True):
      assert np.isfinite(np.asarray(a)).all()
      np.testing.assert_allclose(a, w, atol=1e-5, rtol=1e-5, err_msg=f"M={m}, docs={docs}")


@pytest.mark.parametrize("implementation,block_sizes", [
    ("pallas_gpu", kernels.DecodeBlockSizes(block_w=16, block_c=16)),
    ("pallas_tpu", kernels.DecodeBlockSizes(block_w=128, block_c=8)),
])
def test_pallas_decode_matches_reference(implementation, block_sizes):
  rng = np.random.default_rng(2)
  f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  b, h, kh, d, w, c = 4, 8, 2, 16, 19, 45
  q, wk, wv, ek, ev, sink = f(b, h, d), f(b, w, kh, d), f(b, w, kh, d), f(b, c, kh, d), f(
      b, c, kh, d), f(h)
  valid = jnp.asarray(rng.random((b, w)) < 0.5).at[0].set(False)
  num_entries = jnp.asarray([0, 7, 30, 45])  # empty, inside one split, across splits, full
  run = jax.jit(lambda *a: kernels.decode_attention(
      *a, sink_H=sink, implementation=implementation, interpret=True, num_splits=3,
      block_sizes=block_sizes))
  got = run(q, wk, wv, valid, ek, ev, num_entries)
  want = kernels.decode_attention(q, wk, wv, valid, ek, ev, num_entries, sink_H=sink)
  assert np.isfinite(np.asarray(got)).all()
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
