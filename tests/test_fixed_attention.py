"""The window and fixed attention kinds: visibility, documents, equivalences, config errors."""

import dataclasses
import functools
import itertools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

from chunkformer.attention import AttentionContext, compressed_core
from chunkformer.attention.fixed import FixedAttention, WindowAttention
from chunkformer.attention.full import FullAttention
from chunkformer.compression import static_offsets
from chunkformer.config import AttentionConfig, Config, ConfigError, DataConfig, ModelConfig

T, E = 14, 16


def _normal(seed, shape):
  """Test data from numpy (jax.random would compile its RNG for every shape)."""
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def _model(num_kv_heads=2, **attn):
  return ModelConfig(d_model=E, num_heads=4, num_kv_heads=num_kv_heads, head_dim=8,
                     attention=AttentionConfig(**attn))


def _ctx(segment_ids=None, train=False):
  seg = jnp.zeros((1, T), jnp.int32) if segment_ids is None else jnp.asarray(segment_ids)[None]
  starts = np.r_[0, np.flatnonzero(np.diff(np.asarray(seg[0]))) + 1]
  pos = np.arange(T) - starts[np.searchsorted(starts, np.arange(T), side="right") - 1]
  return AttentionContext(jnp.zeros((1, T), jnp.int32), jnp.asarray(pos)[None], seg, train)


def _init(module, x, ctx, seed=1):
  """Random parameters of the module's shapes (Flax init would compile its RNG: seconds)."""
  shapes = nn.meta.unbox(jax.eval_shape(module.init, jax.random.key(0), x, ctx, {})["params"])
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(
      lambda s: jnp.asarray(rng.normal(size=s.shape) * 0.5, s.dtype), shapes)


def _apply(module, params, x, ctx, **kwargs):
  return jax.jit(functools.partial(module.apply, **kwargs))({"params": params}, x, ctx, {})


def _dependency(module, ctx, seed=0):
  """dep[t, s]: summed |d (r . y_t) / d x_s| of one attention layer (r a random direction)."""
  x = _normal(seed, (1, T, E))
  r = _normal(seed + 2, (E,))
  params = _init(module, x, ctx, seed + 1)
  cotangents = jnp.eye(T)[:, None, :, None] * r  # one query row t at a time

  @jax.jit
  def grads(x):
    _, vjp = jax.vjp(lambda x: module.apply({"params": params}, x, ctx, {})[0], x)
    return jax.vmap(vjp)(cotangents)[0]

  return np.abs(np.asarray(grads(x))[:, 0]).sum(axis=-1)


def _expected_dependency(model, layer_attn, segment_ids):
  """Which tokens s reach query t: in its window, or pooled into an entry visible to t."""
  a, m = layer_attn, layer_attn.chunk_size
  seg = np.zeros(T, int) if segment_ids is None else np.asarray(segment_ids)
  dep = np.zeros((T, T), bool)
  for t, s in itertools.product(range(T), range(T)):
    if s > t or seg[s] != seg[t]:
      continue
    if t - s < a.window:
      dep[t, s] = True
    for o in static_offsets(model, a, 0):
      for j in range(T // m + 2):
        end = (j + 1) * m - 1 - o
        first = (j - 1 if a.overlap else j) * m - o
        if first <= s <= end and end <= t and seg[end] == seg[t] == seg[s]:
          dep[t, s] = True
  # Query t's own token reaches y_t through the query whenever t sees anything at all.
  dep[np.arange(T), np.arange(T)] |= dep.any(axis=1)
  return dep


CASES = (dict(chunk_size=4, window=2),
         dict(chunk_size=3, window=3, overlap=True, stagger="heads"),
         dict(chunk_size=2, window=1, pooling="mean", chunk_offset=1),
         dict(chunk_size=4, window=0, pooling="mlp", overlap=True, sink=True),
         dict(chunk_size=5, window=2, shared_kv=False, pooling="gated_no_bias"))


@functools.cache
def _case_dependency(case: int):
  """(measured, expected) dependency of visibility case ``case``, computed once per run."""
  model = _model(kind="fixed", **CASES[case])
  dep = _dependency(FixedAttention(model, model.attention, 0), _ctx())
  return dep, _expected_dependency(model, model.attention, None)


class VisibilityTest(parameterized.TestCase):

  @parameterized.parameters(*range(len(CASES)))
  def test_query_never_sees_unfinished_chunk_outside_window(self, case):
    dep, expected = _case_dependency(case)
    np.testing.assert_array_equal(dep[~expected], 0.0)

  @parameterized.parameters(*range(len(CASES)))
  def test_entry_appears_exactly_when_chunk_last_token_arrives(self, case):
    dep, expected = _case_dependency(case)
    self.assertGreater(dep[expected].min(), 1e-7)

  def test_no_attention_or_entry_crosses_documents(self):
    segments = [0] * 6 + [1] * 5 + [2] * 3  # chunks of 4 straddle both boundaries
    for attn in (dict(chunk_size=4, window=3), dict(chunk_size=4, window=2, overlap=True)):
      model = _model(kind="fixed", **attn)
      dep = _dependency(FixedAttention(model, model.attention, 0), _ctx(segments))
      expected = _expected_dependency(model, model.attention, segments)
      np.testing.assert_array_equal(dep[~expected], 0.0)
      self.assertGreater(dep[expected].min(), 1e-7)
      seg = np.asarray(segments)
      self.assertTrue(np.all(dep[seg[:, None] != seg[None, :]] == 0))

  def test_window_kind_sees_exactly_its_window(self):
    model = _model(kind="window", window=3)
    dep = _dependency(WindowAttention(model, model.attention, 0), _ctx())
    t, s = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
    expected = (s <= t) & (t - s < 3)
    np.testing.assert_array_equal(dep > 0, expected)


class EquivalenceTest(parameterized.TestCase):

  # derotate=False: a compressed layer otherwise rotates its raw values (and its output back),
  # which full attention's unrotated values do not (tests/test_deepseek_v4.py covers it).
  @parameterized.parameters(dict(kind="window", window=T + 6),
                            dict(kind="fixed", window=T, chunk_size=T + 2, derotate=False),
                            dict(kind="fixed", window=T, chunk_size=T + 2, overlap=True,
                                 derotate=False))
  def test_empty_entry_set_equals_full_causal_attention(self, **attn):
    model = _model(**attn)
    cls = WindowAttention if attn["kind"] == "window" else FixedAttention
    layer = cls(model, model.attention, 0)
    full = FullAttention(model, model.attention, 0)
    x = _normal(0, (1, T, E))
    for ctx in (_ctx(), _ctx([0] * 5 + [1] * 9)):
      params = _init(layer, x, ctx)
      y, _ = _apply(layer, params, x, ctx)
      y_full, _ = _apply(full, {"qkv": params["qkv"], "out": params["out"]}, x, ctx)
      np.testing.assert_allclose(y, y_full, atol=1e-5, rtol=1e-5)

  @parameterized.parameters((0, True, False), (0, True, True), (1, False, False),
                            (3, True, True), (5, True, False), (14, False, True),
                            (30, True, True))
  def test_blockwise_attention_equals_dense_reference(self, window, entries, sink):
    b, k, g, d, c = 2, 2, 2, 8, 4
    q = _normal(window, (b, T, k * g, d))
    kk, v = (_normal(window + i, (b, T, k, d)) for i in (1, 2))
    seg = jnp.asarray([[0] * T, [0] * 4 + [1] * 7 + [2] * 3])
    ek, ev = (_normal(window + i, (b, c, k, d)) for i in (3, 4))
    ends = jnp.asarray(np.random.default_rng(window).integers(0, T + 3, (b, c, k)))
    eseg = jnp.take_along_axis(seg[:, :, None], jnp.clip(ends, 0, T - 1), axis=1)
    sink_h = _normal(window + 6, (k * g,)) if sink else None
    kwargs = dict(entry_k_BxCxKxD=ek, entry_v_BxCxKxD=ev, entry_ends_BxCxK=ends,
                  entry_segment_ids_BxCxK=eseg) if entries else {}
    out = compressed_core.compressed_attention(q, kk, v, seg, window=window, sink_H=sink_h,
                                               **kwargs)
    # Dense reference: concatenate [raw keys, entries, sink] and take one softmax.
    qg = np.asarray(q).reshape(b, T, k, g, d) / np.sqrt(d)
    t_idx, s_idx = np.arange(T)[:, None], np.arange(T)[None, :]
    raw_mask = (s_idx <= t_idx) & (t_idx - s_idx < window)
    raw_mask = raw_mask[None] & (np.asarray(seg)[:, :, None] == np.asarray(seg)[:, None, :])
    scores = [np.where(raw_mask[:, :, None, None, :],
                       np.einsum("btkgd,bskd->btkgs", qg, np.asarray(kk)), -np.inf)]
    values = [np.asarray(v)]
    if entries:
      vis = (np.asarray(ends).transpose(0, 2, 1)[:, None] <= np.arange(T)[None, :, None, None])
      vis &= np.asarray(eseg).transpose(0, 2, 1)[:, None] == np.asarray(seg)[:, :, None, None]
      scores.append(np.where(vis[:, :, :, None], np.einsum("btkgd,bckd->btkgc", qg,
                                                           np.asarray(ek)), -np.inf))
      values.append(np.asarray(ev))
    if sink:
      scores.append(np.broadcast_to(np.asarray(sink_h).reshape(1, 1, k, g, 1),
                                    (b, T, k, g, 1)))
      values.append(np.zeros((b, 1, k, d)))
    cat = np.concatenate(scores, axis=-1)
    mx = cat.max(axis=-1, keepdims=True)
    p = np.where(np.isfinite(mx), np.exp(cat - np.where(np.isfinite(mx), mx, 0)), 0)
    p = p / np.maximum(p.sum(-1, keepdims=True), 1e-30)
    expected = np.einsum("btkgs,bskd->btkgd", p, np.concatenate(values, axis=1))
    np.testing.assert_allclose(out, expected.reshape(b, T, k * g, d), atol=1e-5, rtol=1e-5)


class OptionsTest(chex.TestCase):

  def test_random_phase_only_in_training_and_per_row(self):
    model = _model(kind="fixed", chunk_size=4, window=2, random_phase=True)
    layer = FixedAttention(model, model.attention, 0)
    x = _normal(0, (8, T, E))
    ctx = dataclasses.replace(_ctx(), tokens_BxT=jnp.zeros((8, T), jnp.int32),
                              positions_BxT=jnp.broadcast_to(jnp.arange(T), (8, T)),
                              segment_ids_BxT=jnp.zeros((8, T), jnp.int32))
    params = _init(layer, x, ctx)
    fixed_model = _model(kind="fixed", chunk_size=4, window=2)
    y_eval, _ = _apply(layer, params, x, ctx)  # no 'phase' rng needed
    y_plain, _ = _apply(FixedAttention(fixed_model, fixed_model.attention, 0), params, x, ctx)
    np.testing.assert_allclose(y_eval, y_plain)
    train_ctx = dataclasses.replace(ctx, train=True)
    (y1, _), sown = _apply(layer, params, x, train_ctx, rngs={"phase": jax.random.key(2)},
                           mutable=["intermediates"])
    (offsets,) = sown["intermediates"]["chunk_offsets"]
    self.assertTrue(bool(jnp.all(offsets == offsets[:, :1])))
    self.assertGreater(len(set(np.asarray(offsets[:, 0]).tolist())), 1)
    differs = np.abs(np.asarray(y1 - y_eval)).max(axis=(1, 2)) > 1e-6
    np.testing.assert_array_equal(differs, np.asarray(offsets[:, 0]) != 0)

  def test_topk_keeps_the_k_best_visible_entries(self):
    scores = _normal(0, (2, 6, 3, 9))
    visible = jnp.asarray(np.random.default_rng(1).random((2, 6, 3, 9)) < 0.6)
    selected = compressed_core.select_topk(scores, visible, 3)
    np.testing.assert_array_equal(selected.sum(-1), np.minimum(visible.sum(-1), 3))
    self.assertTrue(bool(jnp.all(~selected | visible)))
    worst_kept = jnp.where(selected, scores, jnp.inf).min(-1)
    best_dropped = jnp.where(visible & ~selected, scores, -jnp.inf).max(-1)
    self.assertTrue(bool(jnp.all(worst_kept > best_dropped)))

  def test_topk_trains_indexer_and_full_topk_changes_nothing(self):
    x = _normal(0, (1, T, E))
    ctx = _ctx()
    outs = {}
    params = None
    for topk in (4, 2, 0):
      model = _model(kind="fixed", chunk_size=3, window=2, topk=topk)
      layer = FixedAttention(model, model.attention, 0)
      params = _init(layer, x, ctx) if params is None else params
      used = {k: v for k, v in params.items() if topk or k != "indexer"}
      outs[topk] = _apply(layer, used, x, ctx)[0]
      if topk == 2:
        grads = jax.jit(jax.grad(
            lambda p, layer=layer: jnp.sum(layer.apply({"params": p}, x, ctx, {})[0]**2)))(
                params)
        self.assertGreater(float(jnp.abs(grads["indexer"]["kernel"]).max()), 0.0)
    np.testing.assert_allclose(outs[4], outs[0], atol=1e-6)  # T=14, M=3: 4 entries at most
    self.assertGreater(float(jnp.abs(outs[2] - outs[0]).max()), 1e-4)


class ConfigTest(parameterized.TestCase):

  @parameterized.parameters(
      (dict(chunk_size=0), "chunk_size"),
      (dict(window=-1), "window"),
      (dict(topk=65), "topk"),  # 256 tokens / M=4 = 64 entries
      (dict(topk=4, implementation="pallas_gpu"), "topk"),  # the kernels see every entry
      (dict(stagger="heads", implementation="pallas_tpu"), "stagger"),  # one end per entry
      (dict(implementation="blockwise"), "implementation"),  # a full-attention path only
  )
  def test_bad_attention_config_names_the_field(self, attn, field):
    attention = AttentionConfig(kind="fixed", chunk_size=4, window=8)
    model = ModelConfig(attention=dataclasses.replace(attention, **attn))
    with self.assertRaisesRegex(ConfigError, rf"model\.attention\[layer 0\]\.{field}"):
      Config(model=model, data=DataConfig(seq_len=256)).validate()

  def test_overlap_with_odd_channel_split_names_the_field(self):
    model = ModelConfig(d_model=15, num_heads=3, num_kv_heads=3, head_dim=5,
                        attention=AttentionConfig(kind="fixed", overlap=True))
    with self.assertRaisesRegex(ConfigError, r"attention\[layer 0\]\.overlap"):
      model.validate()

  def test_topk_at_capacity_is_accepted(self):
    model = ModelConfig(attention=AttentionConfig(kind="fixed", chunk_size=4, window=8,
                                                  topk=64))
    Config(model=model, data=DataConfig(seq_len=256)).validate()


if __name__ == "__main__":
  absltest.main()
