"""Sparse prefill: keep-everything equals the dense prefill on every model kind (outputs, caches,
the next 16 decoded tokens); online estimation picks what its definition says (numpy
re-derivations); plans that do not fit a model are refused naming the field."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from chunkformer import decode
from chunkformer import sparse_prefill as sp
from chunkformer.config_sections.errors import ConfigError
from chunkformer.eviction import SnapKV
from chunkformer.model import Transformer
from chunkformer.sparse_prefill import estimate, index, search
from tests.test_decode import _model, _params, _tokens

PROMPT, MAX_LEN, STEPS = 14, 32, 16

KINDS = {
    "full": dict(layer_pattern="kind=full", num_layers=2, key_shift=2),
    "fixed_window_full": dict(overlap=True),
    "dynamic_full": dict(layer_pattern="kind=dynamic,boundary=fixed;kind=full", num_layers=2),
    "deepseek_v4_full": dict(layout="deepseek_v4", query_rank=16, output_groups=2,
                             output_rank=8, layer_pattern="overlap=true;kind=window;kind=full"),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_keep_all_prefill_equals_the_dense_prefill_on_every_kind(kind):
  config = _model(**KINDS[kind])
  model = Transformer(config)
  params = _params(model)
  prompt = _tokens()[:, :PROMPT]
  plan = sp.Plan.uniform(config, sp.KeepAll(), block=4)  # 4 query blocks, the last partial
  assert any(heads is not None for heads in plan.layers)
  dense_logits, dense_cache = decode.prefill(model, params, prompt, MAX_LEN)
  logits, cache = decode.prefill(model, params, prompt, MAX_LEN, sparse=plan)
  np.testing.assert_allclose(logits, dense_logits, atol=1e-5, rtol=0)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=0),
                         cache, dense_cache)
  np.testing.assert_array_equal(
      decode.generate(model, params, prompt, STEPS, MAX_LEN, sparse=plan),
      decode.generate(model, params, prompt, STEPS, MAX_LEN))


def test_keep_all_then_eviction_equals_eviction_after_a_dense_prefill():
  config = _model(**KINDS["full"])
  model = Transformer(config)
  params = _params(model)
  prompt = _tokens()[:, :PROMPT]
  policy = SnapKV(budget=8, window=4, kernel=3)
  plan = sp.Plan.uniform(config, sp.KeepAll(), block=4)
  want, want_cache = decode.prefill(model, params, prompt, MAX_LEN, eviction=policy)
  got, cache = decode.prefill(model, params, prompt, MAX_LEN, eviction=policy, sparse=plan)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=0),
                         cache, want_cache)


@pytest.mark.parametrize("implementation", ["pallas_gpu", "pallas_tpu"])
def test_the_kernels_prefill_as_the_xla_path_does(implementation):
  config = _model(layer_pattern="kind=full", num_layers=2, num_kv_heads=1)
  model = Transformer(config)
  params = _params(model, seed=2)
  prompt = jnp.asarray(np.random.default_rng(0).integers(0, 32, (2, 40)), jnp.int32)
  pattern = sp.VerticalSlash(vertical=5, slash=3, last_q=8, forced_vertical=1, forced_slash=1)
  xla = sp.Plan.uniform(config, pattern, block=16)
  kernel = dataclasses.replace(xla, implementation=implementation, interpret=True)
  want, _ = decode.prefill(model, params, prompt, 48, sparse=xla)
  got, _ = decode.prefill(model, params, prompt, 48, sparse=kernel)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  dense, _ = decode.prefill(model, params, prompt, 48)
  assert float(jnp.abs(dense - want).max()) > 1e-3  # the pattern dropped something


def _numpy_mask(idx, t, block):
  blocks, counts, cols, keep = (np.asarray(x) for x in idx)
  b, h, n = counts.shape
  out = np.zeros((b, h, t, t), bool)
  for r, head, q in np.ndindex(b, h, t):
    listed = set(blocks[r, head, q // block, :counts[r, head, q // block]].tolist())
    kept = set(cols[r, head][keep[r, head, q // block]].tolist())
    out[r, head, q, :q + 1] = [s // block in listed or s in kept for s in range(q + 1)]
  return out


def _qk(seed, b=1, t=45, h=2, kh=1, d=8):
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.normal(size=(b, t, h, d)), jnp.float32),
          jnp.asarray(rng.normal(size=(b, t, kh, d)), jnp.float32))


def test_vertical_slash_reads_the_top_columns_and_diagonals_of_the_last_queries():
  q, k = _qk(0)
  t, block, w, nv, ns = 45, 8, 6, 5, 4
  got = _numpy_mask(estimate.vertical_slash(q, k, block, nv, ns, w, 2, 1), t, block)
  qn, kn = np.asarray(q, np.float64), np.asarray(k, np.float64)
  for head in range(2):
    logits = qn[0, t - w:, head] @ kn[0, :, 0].T / np.sqrt(8)
    logits[np.arange(t)[None, :] > np.arange(t - w, t)[:, None]] = -np.inf
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    column = p.sum(0)
    column[:2] = np.inf  # forced_vertical = 2
    diag = np.array([sum(p[i, t - w + i - o] for i in range(w) if t - w + i - o >= 0)
                     for o in range(t)])
    diag[:1] = np.inf  # forced_slash = 1
    cols = set(np.argsort(-column, kind="stable")[:nv].tolist())
    offsets = np.argsort(-diag, kind="stable")[:ns]
    want = np.zeros((t, t), bool)
    for qi, s in np.ndindex(t, t):
      # a slash line o covers the key blocks it crosses inside the query block
      crossed = {(qi // block * block + r - o) // block for o in offsets
                 for r in range(block) if qi // block * block + r - o >= 0}
      want[qi, s] = s <= qi and (s in cols or s // block in crossed)
    np.testing.assert_array_equal(got[0, head], want)


def test_block_sparse_reads_the_top_pooled_blocks_and_the_diagonal():
  q, k = _qk(1, h=2, kh=2)
  t, block, top = 45, 8, 2
  got = _numpy_mask(estimate.block_sparse(q, k, block, top), t, block)
  n = 6
  for head in range(2):
    pooled = lambda x, h=head: np.stack([np.asarray(x)[0, i * block:(i + 1) * block, h].mean(0)
                                         for i in range(n)])
    scores = pooled(q) @ pooled(k).T
    want = np.zeros((t, t), bool)
    for i in range(n):
      earlier = [j for j in np.argsort(-scores[i, :i]) if j < i][:top - 1]
      for j in [i] + earlier:
        want[i * block:(i + 1) * block, j * block:(j + 1) * block] = True
    np.testing.assert_array_equal(got[0, head], want & np.tri(t, dtype=bool))


def test_a_shape_reads_the_sink_blocks_and_the_local_blocks():
  q, _ = _qk(2)
  got = _numpy_mask(estimate.a_shape(q, 8, 1, 2), 45, 8)
  s, t = np.arange(45)[None, :], np.arange(45)[:, None]
  want = (s <= t) & ((s < 8) | (s // 8 >= t // 8 - 1))
  np.testing.assert_array_equal(got[0, 0], want)


def test_kept_fraction_counts_the_visible_pairs_of_the_index():
  q, k = _qk(3, b=2)
  idx = index.merge_heads([estimate.vertical_slash(q, k, 8, 7, 3, 5, 2, 1),
                           estimate.block_sparse(q, k, 8, 2)], [1, 0])
  mask = _numpy_mask(idx, 45, 8)
  np.testing.assert_allclose(index.kept_fraction(idx, 45, 8), mask.sum((-1, -2)) / (45 * 46 / 2),
                             rtol=1e-6)
  # merge_heads: head 0 is block-sparse's head 0, head 1 vertical-slash's head 1
  np.testing.assert_array_equal(mask[:, 0], _numpy_mask(estimate.block_sparse(q, k, 8, 2), 45,
                                                        8)[:, 0])
  assert mask[:, 1].sum() == _numpy_mask(estimate.vertical_slash(q, k, 8, 7, 3, 5, 2, 1), 45,
                                         8)[:, 1].sum()


def test_the_search_takes_the_best_recall_within_the_work_ceiling():
  recall = np.array([[0.9, 0.8, 0.95], [0.5, 0.5, 0.2]])
  work = np.array([[0.3, 0.1, 0.6], [0.4, 0.2, 0.1]])
  np.testing.assert_array_equal(search.choose(recall, work, None), [2, 1])  # tie: less work
  np.testing.assert_array_equal(search.choose(recall, work, 0.35), [0, 1])
  np.testing.assert_array_equal(search.choose(recall, work, 0.05), [1, 2])  # none fits


def test_plans_that_do_not_fit_are_refused_naming_the_field():
  config = _model()  # fixed; window; full
  with pytest.raises(ConfigError, match=r"sparse.layers\[0\].*'fixed'"):
    sp.resolve(config, sp.Plan(((sp.KeepAll(),) * 4, None, (sp.KeepAll(),) * 4)))
  with pytest.raises(ConfigError, match=r"sparse.layers\[2\].*3 patterns for 4"):
    sp.resolve(config, sp.Plan((None, None, (sp.KeepAll(),) * 3)))
  with pytest.raises(ConfigError, match="sparse: give a pattern"):
    decode.prefill(Transformer(config), {}, jnp.zeros((1, 4), jnp.int32), 8, sparse="dense")
  with pytest.raises(ConfigError, match=r"sparse.vertical_slash.vertical"):
    sp.VerticalSlash(vertical=0)
  with pytest.raises(ConfigError, match=r"sparse.topk.*known: top"):
    sp.from_dict({"pattern": "block_sparse", "topk": 3})
  assert sp.from_dict({"pattern": "block_sparse", "top": 3}) == sp.BlockSparse(top=3)
  assert sp.Plan.uniform(config, sp.BlockSparse()).layers[:2] == (None, None)
  with pytest.raises(ValueError, match="decode=True"):  # a training pass never reads a plan
    Transformer(config).apply({"params": {}}, jnp.zeros((1, 4), jnp.int32),
                              sparse=sp.Plan.uniform(config, sp.KeepAll()))
