"""Edge cases of the kernel contracts on every implementation (Pallas in interpret mode).

Rows with no key at all, a zero-slot decode window, bf16 pooling gradients and document ids
that reappear later in a row: each must give the contract's result, not an error or a number
that depends on the implementation or the tile size.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from tests import kernel_cases as kc

IMPLEMENTATIONS = kernels.IMPLEMENTATIONS



def _normal(rng, *shape, dtype=jnp.float32):
  return jnp.asarray(rng.standard_normal(shape), dtype)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_query_with_no_key_at_all_outputs_zero_on_every_implementation(implementation):
  # window 0 and an empty entry buffer: every query sees nothing (the sink has value zero).
  rng = np.random.default_rng(0)
  b, t, h, kh, d = 1, 8, 2, 1, 8
  empty = _normal(rng, b, 0, kh, d)
  none_BxC = jnp.zeros((b, 0), jnp.int32)

  def loss(q, sink):
    o = kernels.chunk_attention(q, _normal(rng, b, t, kh, d), _normal(rng, b, t, kh, d),
                                jnp.zeros((b, t), jnp.int32), empty, empty, none_BxC, none_BxC,
                                window=0, sink_H=sink, implementation=implementation,
                                interpret=True)
    return jnp.sum(o), o

  (_, o), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
      _normal(rng, b, t, h, d), _normal(rng, h))
  np.testing.assert_array_equal(np.asarray(o), 0.0)
  for g in grads:
    np.testing.assert_array_equal(np.asarray(g), 0.0)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("capacity", [0, 5])
def test_decode_with_a_zero_slot_window_attends_to_entries_only(implementation, capacity):
  rng = np.random.default_rng(1)
  b, h, kh, d = 3, 4, 2, 8
  q, ek, ev, sink = (_normal(rng, b, h, d), _normal(rng, b, capacity, kh, d),
                     _normal(rng, b, capacity, kh, d), _normal(rng, h))
  wk = _normal(rng, b, 0, kh, d)
  num_entries = jnp.asarray([0, min(2, capacity), capacity])
  got = kernels.decode_attention(q, wk, wk, jnp.zeros((b, 0), bool), ek, ev, num_entries,
                                 sink_H=sink, implementation=implementation, interpret=True)
  want = kc.decode_oracle(q, wk, wk, np.zeros((b, 0), bool), ek, ev, num_entries, sink_H=sink)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(got)[0], 0.0)  # nothing visible in row 0


_DECODE_BLOCKS = {"xla": None, "pallas_gpu": kernels.DecodeBlockSizes(block_w=16, block_c=16),
                  "pallas_tpu": kernels.DecodeBlockSizes(block_w=128, block_c=8)}


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("window,capacity", [(5, 21), (0, 21), (5, 0)])
def test_decode_per_head_entry_visibility_matches_the_oracle(implementation, window, capacity):
  # entry_visible[b, c, k]: each kv head sees its own subset (staggered chunk ends, an indexer's
  # top-k). Rows: nothing visible; one head sees entries, the other none; a sparse mask
  # across splits; every entry of both heads.
  rng = np.random.default_rng(3)
  b, h, kh, d = 4, 4, 2, 8
  q, sink = _normal(rng, b, h, d), _normal(rng, h)
  wk, wv = _normal(rng, b, window, kh, d), _normal(rng, b, window, kh, d)
  wvalid = jnp.asarray(rng.random((b, window)) < 0.7)
  ek, ev = _normal(rng, b, capacity, kh, d), _normal(rng, b, capacity, kh, d)
  visible = rng.random((b, capacity, kh)) < 0.4
  visible[0] = False
  visible[1, :, 1] = False
  visible[3] = True
  num_entries = jnp.asarray([capacity, min(6, capacity), capacity, min(17, capacity)])
  got = kernels.decode_attention(q, wk, wv, wvalid, ek, ev, num_entries, sink_H=sink,
                                 entry_visible_BxCxK=jnp.asarray(visible),
                                 implementation=implementation, interpret=True, num_splits=3,
                                 block_sizes=_DECODE_BLOCKS[implementation])
  want = kc.decode_oracle(q, wk, wv, np.asarray(wvalid), ek, ev, num_entries, sink_H=sink,
                          entry_visible=visible)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  if not window:  # row 0 sees no key at all: zeros, not NaN
    np.testing.assert_array_equal(np.asarray(got)[0], 0.0)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_decode_of_the_last_token_equals_the_dense_oracle_with_per_head_ends(implementation):
  # The decode contract is the last row of the dense window-plus-entries softmax: ring = the
  # last W raw keys (any slot order), entry c of kv head k visible iff its per-head end <= t.
  rng = np.random.default_rng(6)
  b, t, h, kh, d, window, c = 2, 13, 4, 2, 8, 4, 6
  q, k, v = _normal(rng, b, t, h, d), _normal(rng, b, t, kh, d), _normal(rng, b, t, kh, d)
  ek, ev, sink = _normal(rng, b, c, kh, d), _normal(rng, b, c, kh, d), _normal(rng, h)
  ends_BxCxK = jnp.asarray(np.stack([np.arange(c) * 2 + 1, np.arange(c) * 2 + 4], -1)[None]
                           .repeat(b, 0), jnp.int32)  # head 1 staggered by 3 tokens
  want, _ = kernels.dense_attention(
      q, k, v, jnp.zeros((b, t), jnp.int32), window=window, entry_k_BxCxKxD=ek,
      entry_v_BxCxKxD=ev, entry_visible_from_BxC=ends_BxCxK,
      entry_segment_ids_BxC=jnp.zeros((b, c, kh), jnp.int32), sink_H=sink)
  ring = np.roll(np.arange(t - window, t), 2)  # ring-buffer order
  visible = ends_BxCxK <= t - 1
  got = kernels.decode_attention(q[:, -1], k[:, ring], v[:, ring], jnp.ones((b, window), bool),
                                 ek, ev, jnp.full((b,), c), sink_H=sink,
                                 entry_visible_BxCxK=visible, implementation=implementation,
                                 interpret=True, block_sizes=_DECODE_BLOCKS[implementation])
  assert 0 < int(visible[..., 1].sum()) < int(visible[..., 0].sum())
  np.testing.assert_allclose(got, want[:, -1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("implementation", ["pallas_gpu", "pallas_tpu"])
def test_decode_gradient_with_per_head_visibility_matches_the_reference(implementation):
  rng = np.random.default_rng(4)
  b, h, kh, d, w, c = 2, 4, 2, 8, 3, 9
  args = [_normal(rng, b, h, d), _normal(rng, b, w, kh, d), _normal(rng, b, w, kh, d),
          jnp.ones((b, w), bool), _normal(rng, b, c, kh, d), _normal(rng, b, c, kh, d),
          jnp.asarray([4, 9])]
  visible = jnp.asarray(rng.random((b, c, kh)) < 0.5)

  def grads(impl):
    def loss(q, ek):
      o = kernels.decode_attention(q, *args[1:4], ek, *args[5:],
                                   entry_visible_BxCxK=visible, implementation=impl,
                                   interpret=True, block_sizes=_DECODE_BLOCKS[impl])
      return jnp.sum(o * o)
    return jax.grad(loss, argnums=(0, 1))(args[0], args[4])

  for got, want in zip(grads(implementation), grads("xla"), strict=True):
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_decode_refuses_an_entry_mask_of_the_wrong_shape():
  rng = np.random.default_rng(5)
  z = _normal(rng, 1, 3, 1, 8)
  with pytest.raises(ValueError, match="entry_visible_BxCxK must be bool of shape"):
    kernels.decode_attention(_normal(rng, 1, 2, 8), z, z, jnp.ones((1, 3), bool), z, z,
                             jnp.asarray([3]), entry_visible_BxCxK=jnp.ones((1, 1, 3), bool))


@pytest.mark.parametrize("implementation,block_sizes", [
    ("pallas_gpu", kernels.PoolBlockSizes(block_t=16, block_n=16)),
    ("pallas_tpu", kernels.PoolBlockSizes(block_t=8, block_n=128)),
])
def test_pallas_pool_gradient_of_bf16_inputs_has_float32_precision(implementation, block_sizes):
  # The backward must use the float32 entries, not the bf16-rounded outputs: the float32 slot
  # bias gradient then agrees with the xla path to float32 rounding (bf16 entries: ~5e-3).
  rng = np.random.default_rng(0)
  b, t, n, capacity = 2, 30, 16, 12
  seg = kc.segment_ids(rng, b, t, 2)
  ends = jnp.asarray(kc.end_flags(rng, seg, "dynamic"))
  values = _normal(rng, b, t, n, dtype=jnp.bfloat16)
  logits = 3 * _normal(rng, b, t, n, dtype=jnp.bfloat16)
  slot_bias, ct = _normal(rng, 4, n), _normal(rng, b, capacity, n)

  def grad(impl, sizes=None):
    def loss(bias):
      pooled = kernels.segment_pool(values, logits, ends, jnp.asarray(seg), capacity=capacity,
                                    slot_bias_SxN=bias, implementation=impl, interpret=True,
                                    block_sizes=sizes)[0]
      return jnp.sum(pooled.astype(jnp.float32) * ct)
    return np.asarray(jax.grad(loss)(slot_bias))

  want = grad("xla")
  got = grad(implementation, block_sizes)
  assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def _reappearing_ids_case(seed):
  """Row 0 holds ids 5 5 5 5 5 5 7 7 7 7 5 5 5 5 5 5 9 9 9 9: document 5 appears twice."""
  rng = np.random.default_rng(seed)
  seg = np.asarray([[5] * 6 + [7] * 4 + [5] * 6 + [9] * 4], np.int32)
  b, t = seg.shape
  ends = kc.end_flags(rng, seg, 3)
  _, _, entry_ends, entry_seg, _, _ = kc._structure(jnp.asarray(ends), jnp.asarray(seg), t)
  h, kh, d = 2, 1, 8
  args = (_normal(rng, b, t, h, d), _normal(rng, b, t, kh, d), _normal(rng, b, t, kh, d),
          jnp.asarray(seg), _normal(rng, b, t, kh, d), _normal(rng, b, t, kh, d), entry_ends,
          entry_seg)
  return args


@pytest.mark.parametrize("implementation,block_sizes", [
    ("xla", None),
    ("pallas_gpu", kernels.AttentionBlockSizes(block_q=16, block_k=16, block_c=16)),
    ("pallas_gpu", kernels.AttentionBlockSizes(block_q=32, block_k=32, block_c=32)),
    ("pallas_tpu", kernels.AttentionBlockSizes(block_q=8, block_k=8, block_c=8)),
])
def test_reappearing_document_id_starts_a_new_document_at_every_tile_size(implementation,
                                                                         block_sizes):
  args = _reappearing_ids_case(0)
  window = 12  # long enough to reach from the second run of id 5 back into the first
  got = kernels.chunk_attention(*args, window=window, implementation=implementation,
                                interpret=True, block_sizes=block_sizes)
  # The contract: documents are contiguous runs, so the oracle runs on run indices.
  runs = np.cumsum(np.concatenate([[True], args[3][0, 1:] != args[3][0, :-1]]))[None]
  entry_ends = np.asarray(args[6])
  entry_runs = np.where(entry_ends < runs.shape[1],
                        runs[0, np.minimum(entry_ends, runs.shape[1] - 1)], -1)
  want = kc.attention_oracle(*args[:3], runs, *args[4:6], entry_ends, entry_runs, window=window)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  # and the second run of id 5 really differs from what raw-id matching would give
  raw = kc.attention_oracle(*args, window=window)
  assert np.abs(raw[0, 10:16] - want[0, 10:16]).max() > 1e-3
