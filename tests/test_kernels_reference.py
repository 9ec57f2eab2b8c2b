"""The pure-jnp references (the "xla" implementation) against naive loop oracles."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels import layout
from tests import kernel_cases as kc

# Jitted once per static configuration: eager op-by-op dispatch would dominate the run time.
attention = jax.jit(kernels.chunk_attention, static_argnames=("window", "implementation"))
pool = jax.jit(kernels.segment_pool, static_argnames=("capacity", "implementation"))
decode = jax.jit(kernels.decode_attention, static_argnames=("implementation",))
visible_range = jax.jit(kernels.visible_entry_range)
structure = jax.jit(layout.chunk_structure, static_argnums=2)

# (t, h, kh, m, docs, window, sink): odd lengths, GQA 1/2/4 and MQA, fixed and dynamic chunks,
# window 0 (entries only) and a window longer than the row.
ATTENTION_CASES = [
    (24, 2, 1, 4, 2, 5, False),
    (17, 4, 2, "dynamic", 3, 3, True),
    (30, 4, 4, 1, 1, 0, False),
    (21, 4, 1, 3, 2, 40, True),
    (19, 8, 2, 8, 3, 2, False),
]


dense = jax.jit(kernels.dense_attention, static_argnames=("window",))


def _dense(q, k, v, seg, ek, ev, ends, eseg, **kw):
  return dense(q, k, v, seg, entry_k_BxCxKxD=ek, entry_v_BxCxKxD=ev, entry_visible_from_BxC=ends,
               entry_segment_ids_BxC=eseg, **kw)


@pytest.mark.parametrize("t,h,kh,m,docs,window,sink", ATTENTION_CASES)
def test_chunk_attention_reference_matches_dense_oracle(t, h, kh, m, docs, window, sink):
  args, kw = kc.attention_case(t + h, b=2, t=t, h=h, kh=kh, m=m, docs=docs, window=window,
                               sink=sink)
  want, weights = _dense(*args, **kw)
  np.testing.assert_allclose(attention(*args, **kw), want, atol=2e-6, rtol=1e-5)
  total = weights.raw_BxTxHxS.sum(-1) + weights.entries_BxTxHxC.sum(-1) + weights.sink_BxTxH
  assert np.all((np.abs(total - 1) < 1e-5) | (total == 0))


class DenseOracleTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_dense_oracle_matches_loop_oracle_and_its_weights_sum_to_one(self):
    # The dense oracle is checked once against naive loops over every query, key and entry.
    args, kw = kc.attention_case(4, b=2, t=17, h=4, kh=2, m="dynamic", docs=3, window=3,
                                 sink=True)
    q, k, v, seg, ek, ev, ends, eseg = args
    run = self.variant(lambda *a: kernels.dense_attention(
        *a[:4], window=3, entry_k_BxCxKxD=a[4], entry_v_BxCxKxD=a[5],
        entry_visible_from_BxC=a[6], entry_segment_ids_BxC=a[7], sink_H=a[8]))
    out, weights = run(q, k, v, seg, ek, ev, ends, eseg, kw["sink_H"])
    np.testing.assert_allclose(out, kc.attention_oracle(*args, **kw), atol=2e-6, rtol=1e-5)
    total = weights.raw_BxTxHxS.sum(-1) + weights.entries_BxTxHxC.sum(-1) + weights.sink_BxTxH
    np.testing.assert_allclose(total, 1.0, atol=1e-5)  # the sink makes every row see something

  @chex.variants(with_jit=True, without_jit=True)
  def test_visible_entry_range_is_the_visibility_rule(self):
    args, _ = kc.attention_case(7, b=2, t=23, h=2, kh=1, m="dynamic", docs=3, window=0)
    seg, ends, eseg = args[3], args[6], args[7]
    start, stop = self.variant(kernels.visible_entry_range)(ends, eseg, seg)
    c = np.arange(ends.shape[1])[None, None]
    in_range = (c >= np.asarray(start)[..., None]) & (c < np.asarray(stop)[..., None])
    np.testing.assert_array_equal(
        in_range, self.variant(kernels.entry_visibility_BxTxC)(ends, eseg, seg))


def test_query_that_sees_nothing_outputs_zero_with_finite_gradients():
  # window 0 and chunks of 8: the first 7 tokens of every document see no entry yet.
  args, kw = kc.attention_case(3, b=1, t=20, h=2, kh=1, m=8, docs=2, window=0)
  out = attention(*args, **kw)
  blind = np.asarray(args[6])[0, 0] > np.arange(20)  # before the first entry closes
  assert blind.any()
  np.testing.assert_array_equal(np.asarray(out)[0, blind], 0.0)
  grads = jax.grad(lambda q, ek: attention(q, *args[1:4], ek, *args[5:], **kw).sum(),
                   argnums=(0, 1))(args[0], args[4])
  for g in grads:
    assert np.isfinite(np.asarray(g)).all()


def test_entry_ending_in_a_document_is_invisible_to_the_next_document():
  seg = jnp.asarray([[0, 0, 0, 1, 1, 1]])
  entry_ends = jnp.asarray([[1, layout.PAD_END]])
  start, stop = visible_range(entry_ends, jnp.asarray([[0, -1]]), seg)
  np.testing.assert_array_equal(start, [[0, 0, 0, 1, 1, 1]])
  np.testing.assert_array_equal(stop, [[0, 1, 1, 1, 1, 1]])


@pytest.mark.parametrize("m", [1, 3, 4, 8, "dynamic"])
def test_visible_entry_range_is_monotone_and_matches_brute_force(m):
  rng = np.random.default_rng(7)
  seg = kc.segment_ids(rng, 2, 41, 3)
  ends = kc.end_flags(rng, seg, m)
  _, _, e_ends, e_seg, _, _ = structure(jnp.asarray(ends), jnp.asarray(seg), 16)
  start, stop = (np.asarray(x) for x in visible_range(e_ends, e_seg, jnp.asarray(seg)))
  e_ends, e_seg = np.asarray(e_ends), np.asarray(e_seg)
  for b in range(2):
    for t in range(41):
      visible = np.flatnonzero((e_ends[b] <= t) & (e_seg[b] == seg[b, t]))
      np.testing.assert_array_equal(np.arange(start[b, t], stop[b, t]), visible)
  assert (np.diff(start, axis=1) >= 0).all() and (np.diff(stop, axis=1) >= 0).all()


@pytest.mark.parametrize("m,window", [(1, 4), (3, 0), (4, 41), ("dynamic", 7)])
def test_key_columns_see_exactly_what_the_definitions_show(m, window):
  # The GPU kernels' one rule, lo <= t < hi per column (raw keys, then entries), against the
  # definitions pair by pair: a raw key in t's document within the window, an entry ended by t
  # in t's document; an entry given another document's id is seen by nobody. And the column
  # blocks' bounds call a tile interior exactly when every query of it sees every column.
  from kernels import layout

  rng = np.random.default_rng(11)
  seg = kc.segment_ids(rng, 2, 41, 3)
  ends = kc.end_flags(rng, seg, m)
  _, _, e_ends, e_seg, _, _ = structure(jnp.asarray(ends), jnp.asarray(seg), 16)
  e_seg = e_seg.at[:, 2].set(99)  # an id no document has
  _, e_run = layout.document_runs(jnp.asarray(seg), e_ends, e_seg)
  rows = layout.row_layout(jnp.asarray(seg))
  lo, hi = (np.asarray(x) for x in layout.key_columns(
      jnp.asarray(seg), e_ends, e_run, rows.doc_end_BxT, window))
  e_ends, e_seg = np.asarray(e_ends), np.asarray(e_seg)
  t = np.arange(41)[:, None]
  for b in range(2):
    same = seg[b][:, None] == seg[b][None, :]
    raw = same & (t >= np.arange(41)) & (t - np.arange(41) < window)
    ent = (e_ends[b][None, :] <= t) & (e_seg[b][None, :] == seg[b][:, None])
    want = np.concatenate([raw, ent], axis=1)
    np.testing.assert_array_equal((t >= lo[b]) & (t < hi[b]), want)
    assert not want[:, 41 + 2].any()
    blo, bhi = (np.asarray(x) for x in layout.column_block_bounds(
        jnp.asarray(lo[b:b + 1, :56]), jnp.asarray(hi[b:b + 1, :56]), 8))
    for i in range(5):
      for j in range(7):
        whole = want[i * 8:i * 8 + 8, j * 8:j * 8 + 8].all()
        assert whole == ((blo[0, j] <= i * 8) & (bhi[0, j] > i * 8 + 7)), (b, i, j)


@pytest.mark.parametrize("m,capacity", [(1, 64), (3, 8), (4, 16), (8, 16), ("dynamic", 6)])
def test_segment_pool_reference_matches_token_walk_oracle(m, capacity):
  rng = np.random.default_rng(11)
  seg = kc.segment_ids(rng, 2, 37, 3)
  ends = kc.end_flags(rng, seg, m)
  values, logits = rng.standard_normal((2, 37, 5)), 3 * rng.standard_normal((2, 37, 5))
  slot_bias = rng.standard_normal((3, 5))  # chunks longer than 3 share the last slot's bias
  got = pool(jnp.asarray(values, jnp.float32), jnp.asarray(logits, jnp.float32),
                             jnp.asarray(ends), jnp.asarray(seg), capacity=capacity,
                             slot_bias_SxN=jnp.asarray(slot_bias, jnp.float32))
  want = kc.pool_oracle(values, logits, ends, seg, capacity, slot_bias)
  np.testing.assert_allclose(got[0], want[0], atol=1e-5)
  np.testing.assert_array_equal(got[1], want[1])
  np.testing.assert_array_equal(got[2], want[2])


def test_open_chunk_at_a_document_end_produces_no_entry():
  seg = jnp.asarray([[0, 0, 0, 1, 1]])
  ends = jnp.asarray([[True, False, False, False, True]])  # doc 0 leaves tokens 1-2 open
  values = jnp.arange(5, dtype=jnp.float32).reshape(1, 5, 1)
  entries, entry_ends, entry_seg = pool(values, jnp.zeros_like(values), ends, seg,
                                                        capacity=3)
  np.testing.assert_array_equal(entry_ends, [[0, 4, layout.PAD_END]])
  np.testing.assert_array_equal(entry_seg, [[0, 1, layout.PAD_SEGMENT]])
  np.testing.assert_allclose(entries[0, :, 0], [0.0, 3.5, 0.0])  # doc 1's chunk starts at 3


def test_decode_reference_matches_oracle_including_empty_cache():
  rng = np.random.default_rng(5)
  f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  q, wk, wv, ek, ev = f(3, 4, 8), f(3, 6, 2, 8), f(3, 6, 2, 8), f(3, 9, 2, 8), f(3, 9, 2, 8)
  valid = jnp.asarray(rng.random((3, 6)) < 0.5).at[0].set(False)
  num_entries = jnp.asarray([0, 4, 9])
  for sink in (None, f(4)):
    got = decode(q, wk, wv, valid, ek, ev, num_entries, sink_H=sink)
    np.testing.assert_allclose(got, kc.decode_oracle(q, wk, wv, valid, ek, ev, num_entries, sink),
                               atol=2e-6)
  np.testing.assert_array_equal(
      decode(q, wk, wv, valid, ek, ev, num_entries)[0], 0.0)


def test_bad_shapes_raise_value_errors_naming_the_dimension():
  args, kw = kc.attention_case(0, t=8, h=3, kh=2)
  with pytest.raises(ValueError, match="multiple of key/value heads"):
    kernels.chunk_attention(*args, **kw)
  args, kw = kc.attention_case(0, t=8)
  with pytest.raises(ValueError, match="implementation"):
    kernels.chunk_attention(*args, **kw, implementation="cuda")
  with pytest.raises(ValueError, match="powers of two"):
    kernels.chunk_attention(*args, **kw, implementation="pallas_gpu", interpret=True,
                            block_sizes=kernels.AttentionBlockSizes(block_q=24))
  with pytest.raises(ValueError, match="block_n=64"):
    kernels.segment_pool(jnp.zeros((1, 8, 4)), jnp.zeros((1, 8, 4)), jnp.ones((1, 8), bool),
                         jnp.zeros((1, 8), jnp.int32), capacity=8, implementation="pallas_tpu",
                         interpret=True, block_sizes=kernels.PoolBlockSizes(block_n=64))
