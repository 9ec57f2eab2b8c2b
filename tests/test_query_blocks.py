"""query_blocks.attend: the window + entries attention in query blocks equals the whole-row call
(values and gradients, documents, GQA, sink, padding entries) and holds far fewer bytes."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

import kernels
from chunkformer.attention import compressed_core, query_blocks

B, H, KH, D = 2, 4, 2, 8


def _inputs(t, cap, seed=0):
  rng = np.random.default_rng(seed)
  q, k, v = (jnp.asarray(rng.normal(size=(B, t, n, D)), jnp.float32) for n in (H, KH, KH))
  ek, ev = (jnp.asarray(rng.normal(size=(B, cap, KH, D)), jnp.float32) for _ in range(2))
  # Two documents per row (row 1 starts its second one elsewhere).
  seg = np.zeros((B, t), np.int32)
  seg[0, t // 3:] = 1
  seg[1, t // 2 + 3:] = 5
  # Sorted entry ends (visible-from positions): some padding, one visible from T (never seen).
  used = cap - 3
  ends = np.full((B, cap), kernels.PAD_END, np.int32)
  for r in range(B):
    ends[r, :used - 1] = np.sort(rng.choice(np.arange(1, t), used - 1, replace=False))
    ends[r, used - 1] = t
  at = np.minimum(ends, t - 1)
  eseg = np.where(ends == kernels.PAD_END, kernels.PAD_SEGMENT,
                  np.take_along_axis(seg, at, axis=1))
  per_head = lambda x: jnp.broadcast_to(jnp.asarray(x)[:, :, None], (B, cap, KH))
  sink = jnp.asarray(rng.normal(size=(H,)), jnp.float32)
  return (q, k, v, jnp.asarray(seg)), dict(entry_k_BxCxKxD=ek, entry_v_BxCxKxD=ev,
                                           entry_ends_BxCxK=per_head(ends),
                                           entry_segment_ids_BxCxK=per_head(eseg), sink_H=sink)


def _loss(fn, window, **fixed):
  def loss(q, k, v, ek, ev, sink):
    o = fn(q, k, v, fixed["seg"], window=window, entry_k_BxCxKxD=ek, entry_v_BxCxKxD=ev,
           entry_ends_BxCxK=fixed["ends"], entry_segment_ids_BxCxK=fixed["eseg"], sink_H=sink,
           **fixed.get("extra", {}))
    weights = jnp.cos(jnp.arange(o.size, dtype=jnp.float32)).reshape(o.shape)
    return jnp.sum(o * weights), o
  return loss


def test_blocked_equals_whole_row():
  t, window, cap, max_scores = 53, 8, 24, 16 * 24  # 4 blocks of 16 queries, the last partial
  (q, k, v, seg), e = _inputs(t, cap)
  rows = query_blocks.block_rows(t, window, cap, max_scores)
  assert rows < t and rows % window == 0  # the case really runs in several blocks
  fixed = dict(seg=seg, ends=e["entry_ends_BxCxK"], eseg=e["entry_segment_ids_BxCxK"])
  args = (q, k, v, e["entry_k_BxCxKxD"], e["entry_v_BxCxKxD"], e["sink_H"])
  grad = lambda fn, **x: jax.jit(jax.value_and_grad(
      _loss(fn, window, **fixed, **x), argnums=range(6), has_aux=True))(*args)
  (_, o_ref), g_ref = grad(compressed_core.attend)
  (_, o_blk), g_blk = grad(query_blocks.attend, extra=dict(max_scores=max_scores))
  chex.assert_trees_all_close(o_blk, o_ref, atol=1e-6, rtol=1e-6)
  chex.assert_trees_all_close(g_blk, g_ref, atol=1e-5, rtol=1e-5)
  assert float(jnp.abs(o_ref).max()) > 0.1  # the comparison is not between zeros


def test_block_rows():
  assert query_blocks.block_rows(4096, 128, 2048, 2**25) == 4096  # small: one block
  assert query_blocks.block_rows(32768, 128, 16384, 2**24) == 1024
  assert query_blocks.block_rows(4096, 128, 2048, query_blocks.MAX_SCORES) == 4096
  assert query_blocks.block_rows(1000, 7, 100, 10_000) == 98  # a multiple of the window
  assert query_blocks.block_rows(1000, 7, 100, 1) == 7  # at least one window block


def test_blocked_gradient_holds_one_block_of_scores():
  t, window, cap = 1024, 64, 512
  (q, k, v, seg), e = _inputs(t, cap)
  fixed = dict(seg=seg, ends=e["entry_ends_BxCxK"], eseg=e["entry_segment_ids_BxCxK"])
  args = (q, k, v, e["entry_k_BxCxKxD"], e["entry_v_BxCxKxD"], e["sink_H"])

  def temp_bytes(fn, **x):
    f = jax.grad(lambda *a: _loss(fn, window, **fixed, **x)(*a)[0], argnums=range(6))
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes

  scores = B * H * t * cap * 4  # one float32 score per (row, head, query, entry): 16 MiB
  whole = temp_bytes(compressed_core.attend)
  blocked = temp_bytes(query_blocks.attend, extra=dict(max_scores=64 * cap))  # 16 blocks
  assert whole > 3 * scores, whole  # the whole-row backward holds several T x C score tensors
  assert blocked < whole / 4, (blocked, whole)  # measured 9.5 MB against 61 MB


def test_the_fixed_kind_in_query_blocks_equals_the_whole_row(monkeypatch):
  """A fixed layer (paper grid W8/S6, two documents) whose row exceeds the block budget runs
  in query blocks and gives the whole-row layer's output and gradients."""
  from chunkformer.attention.fixed import FixedAttention
  from tests.test_compressor_window import E, _ctx, _model, _params

  t = 50
  m = _model(chunk_size=6, compress_window=8, compress_window_align="start", window=8)
  layer = FixedAttention(m, m.attention, 0)
  x = jnp.asarray(np.random.default_rng(3).normal(size=(1, t, E)), jnp.float32)
  ctx = _ctx(t, segment_ids=[0] * 19 + [1] * (t - 19))
  params = _params(layer, x, ctx, seed=4)

  def run(max_scores):
    monkeypatch.setattr(query_blocks, "MAX_SCORES", max_scores)
    def loss(p, x):
      o = layer.apply({"params": p}, x, ctx, {})[0]
      return jnp.sum(o * jnp.cos(jnp.arange(o.size, dtype=jnp.float32)).reshape(o.shape)), o
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(params, x)

  rows = []
  block_rows = query_blocks.block_rows
  monkeypatch.setattr(query_blocks, "block_rows", lambda *a: rows.append(block_rows(*a)) or
                      rows[-1])
  (_, o_ref), g_ref = run(query_blocks.MAX_SCORES)
  (_, o_blk), g_blk = run(16 * 10)
  assert rows[0] == t and rows[-1] < t  # the second layer really ran in several blocks
  chex.assert_trees_all_close(o_blk, o_ref, atol=1e-5, rtol=1e-5)
  chex.assert_trees_all_close(g_blk, g_ref, atol=1e-4, rtol=1e-4)
