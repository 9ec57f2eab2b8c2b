"""Fidelity to DeepSeek-V4's attention, tested from the formulas.

- Translation invariance: with values rotated back at the query position, shifting every
  position by a multiple of M (fixed chunks), or by anything (content-defined delimiter chunks),
  leaves a layer's output unchanged; without the inverse rotation it does not.
- A reference layer written here in the reference's own layout (trailing RoPE channels in
  adjacent pairs, one K = V vector per token, inverse rotation of the output, low-rank query
  and grouped low-rank output, overlap compressor, lightning indexer) equals chunkformer's
  after ``convert.deepseek_v4.attention_params``.
- The lightning indexer keeps the top-k visible entries of its own scores, and only the
  indexer learns from its KL term.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from flax.core import meta

from chunkformer.attention import AttentionContext
from chunkformer.attention.dynamic import DynamicAttention
from chunkformer.attention.fixed import FixedAttention, WindowAttention
from chunkformer.attention.lightning_indexer import LightningIndexer
from chunkformer.config import AttentionConfig, ConfigError, ModelConfig
from chunkformer.convert import deepseek_v4 as convert

E, H, D = 32, 4, 16
EPS = 1e-6


def _model(num_kv_heads=2, attention=None, **attn) -> ModelConfig:
  """Half the head dim rotates; compressed layers use their own base and YaRN."""
  return ModelConfig(vocab_size=32, d_model=E, num_heads=H, num_kv_heads=num_kv_heads,
                     head_dim=D, rope_fraction=0.5, compressed_rope_base=40000.0,
                     yarn_factor=4.0, yarn_original_len=8,
                     attention=attention or AttentionConfig(**attn))


def _ctx(positions, segment_ids=None, tokens=None):
  positions = jnp.asarray(positions)[None]
  seg = jnp.zeros_like(positions) if segment_ids is None else jnp.asarray(segment_ids)[None]
  tok = jnp.zeros_like(positions) if tokens is None else jnp.asarray(tokens)[None]
  return AttentionContext(tok, positions, seg)


def _random_params(module, x, ctx, seed=0):
  """Random parameters of the module's shapes: matrices ~ N(0, 1/fan_in), norm scales 1 +
  noise, slot biases and sinks noise."""
  shapes = meta.unbox(jax.eval_shape(module.init, jax.random.key(0), x, ctx, {})["params"])
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    name = str(getattr(path[-1], "key", path[-1]))
    n = rng.standard_normal(leaf.shape).astype(np.float32)
    if name == "scale":
      return jnp.asarray(1.0 + 0.1 * n)
    if name in ("ape", "sink"):
      return jnp.asarray(0.5 * n)
    fan_in = math.prod(leaf.shape[:-1]) if name == "wo_a" else leaf.shape[0]
    fan_in = math.prod(leaf.shape[:2]) if name == "wo_b" else fan_in
    return jnp.asarray(n / np.sqrt(fan_in))

  return jax.tree_util.tree_map_with_path(fill, shapes)


def _x(t, seed=1):
  return jnp.asarray(np.random.default_rng(seed).standard_normal((1, t, E)), jnp.float32)


def _jit(module):
  """The layer's forward pass, compiled once per input shape."""
  return jax.jit(lambda p, x, c: module.apply({"params": p}, x, c, {}))


def _apply(module, params, x, ctx):
  return _jit(module)(params, x, ctx)


LAYERS = dict(
    qwen3_shared_kv=dict(layout="qwen3", shared_kv=True),
    qwen3_separate_kv=dict(layout="qwen3", shared_kv=False),
    deepseek_v4=dict(layout="deepseek_v4", query_rank=24, output_groups=2, output_rank=12),
)


class TranslationInvarianceTest(parameterized.TestCase):

  @parameterized.named_parameters(*[(k, v) for k, v in LAYERS.items()])
  def test_fixed_layer_output_is_unchanged_by_a_shift_of_all_positions_by_m(self, layout):
    t, shift = 20, 8
    results = {}
    for derotate in (True, False):
      model = _model(kind="fixed", chunk_size=4, overlap=True, window=3, sink=True,
                     derotate=derotate, **layout)
      module = FixedAttention(model, model.attention, 0)
      x = _x(t)
      params = _random_params(module, x, _ctx(np.arange(t)))
      forward = _jit(module)
      base = forward(params, x, _ctx(np.arange(t)))[0]
      moved = forward(params, x, _ctx(np.arange(t) + shift))[0]
      results[derotate] = float(jnp.max(jnp.abs(moved - base)))
      self.assertGreater(float(jnp.max(jnp.abs(base))), 0.3)  # outputs of order one
    self.assertLess(results[True], 1e-5)
    self.assertGreater(results[False], 1e-3)  # the test can fail: without it, position leaks

  @parameterized.named_parameters(("qwen3_shared_kv", LAYERS["qwen3_shared_kv"]),
                                  ("deepseek_v4", LAYERS["deepseek_v4"]))
  def test_delimiter_chunked_content_output_is_unchanged_by_any_shift(self, layout):
    """Content after k tokens of another document, its positions moved by k: its outputs equal
    those of the content alone (chunks are content-defined, the rest is relative)."""
    n = 16
    rng = np.random.default_rng(3)
    content = rng.integers(0, 32, n)
    content[[0, 5, 9, 13]] = 3  # delimiters: chunks close after them
    attn = dict(kind="dynamic", boundary="delimiter", delimiters="3", max_chunk=8, window=3,
                sink=True, **layout)
    model = _model(num_kv_heads=1, **attn)
    module = DynamicAttention(model, model.attention, 0)
    x_content = _x(n, seed=4)
    params = _random_params(module, x_content, _ctx(np.arange(n), tokens=content))
    forward, old_forward = _jit(module), _jit(
        DynamicAttention(model, dataclasses.replace(model.attention, derotate=False), 0))
    alone = forward(params, x_content, _ctx(np.arange(n), tokens=content))[0]
    old_alone = old_forward(params, x_content, _ctx(np.arange(n), tokens=content))[0]
    for k in (1, 3, 6):
      filler = rng.integers(0, 32, k)
      x = jnp.concatenate([_x(k, seed=5 + k), x_content], axis=1)
      ctx = _ctx(np.concatenate([np.arange(k), k + np.arange(n)]),
                 segment_ids=np.r_[np.zeros(k, int), np.ones(n, int)],
                 tokens=np.r_[filler, content])
      np.testing.assert_allclose(forward(params, x, ctx)[0][0, k:], alone[0], atol=1e-5, rtol=0)
      if k == 3:  # the test can fail: without the inverse rotation, position leaks
        old_shifted = old_forward(params, x, ctx)[0]
        self.assertGreater(float(jnp.max(jnp.abs(old_shifted[0, k:] - old_alone[0]))), 1e-3)


# The reference, written from DeepSeek-V4's public inference code (numpy, float64, one row).

def _ref_freqs(rd, base, factor, original_len, beta_fast=32, beta_slow=1):
  freqs = 1.0 / base ** (np.arange(0, rd, 2) / rd)
  if original_len:
    def corr(rot):
      return rd * math.log(original_len / (rot * 2 * math.pi)) / (2 * math.log(base))
    low, high = max(math.floor(corr(beta_fast)), 0), min(math.ceil(corr(beta_slow)), rd - 1)
    ramp = np.clip((np.arange(rd // 2) - low) / ((high + 0.001 if low == high else high) - low),
                   0, 1)
    freqs = freqs / factor * ramp + freqs * (1 - ramp)
  return freqs


def _ref_rope(x, positions, freqs, inverse=False):
  """Rotates the trailing 2*len(freqs) channels as adjacent (real, imaginary) pairs."""
  rd = 2 * len(freqs)
  z = x[..., -rd:].reshape(x.shape[:-1] + (rd // 2, 2))
  z = z[..., 0] + 1j * z[..., 1]
  rot = np.exp(1j * np.asarray(positions)[:, None] * freqs)
  rot = rot.reshape(rot.shape[:1] + (1,) * (z.ndim - 2) + rot.shape[1:])
  z = z * (np.conj(rot) if inverse else rot)
  out = x.copy()
  out[..., -rd:] = np.stack([z.real, z.imag], axis=-1).reshape(z.shape[:-1] + (rd,))
  return out


def _rms(x, w=None):
  y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS)
  return y if w is None else y * w


def _softmax(x, axis):
  e = np.exp(x - np.max(x, axis=axis, keepdims=True))
  return e / e.sum(axis=axis, keepdims=True)


def _ref_compress(w, prefix, x, m, d, overlap, freqs):
  t = x.shape[0]
  c = t // m
  kv = (x @ w[prefix + "wkv.weight"].T)[:c * m].reshape(c, m, -1)
  score = (x @ w[prefix + "wgate.weight"].T)[:c * m].reshape(c, m, -1) + w[prefix + "ape"]
  if overlap:  # slots 0..m-1: chunk i-1's first d channels; m..2m-1: chunk i's last d
    kv2, score2 = np.zeros((c, 2 * m, d)), np.full((c, 2 * m, d), -np.inf)
    kv2[:, m:], score2[:, m:] = kv[:, :, d:], score[:, :, d:]
    kv2[1:, :m], score2[1:, :m] = kv[:-1, :, :d], score[:-1, :, :d]
    kv, score = kv2, score2
  entries = _rms((kv * _softmax(score, 1)).sum(1), w[prefix + "norm.weight"])
  return _ref_rope(entries, np.arange(c) * m, freqs)


def _ref_layer(w, x, cfg):
  """One attention layer of the reference (x: T x E) -> T x E."""
  t = x.shape[0]
  m, win, d, g = cfg["m"], cfg["window"], D, cfg["groups"]
  freqs = cfg["freqs"]
  pos = np.arange(t)
  qr = _rms(x @ w["wq_a.weight"].T, w["q_norm.weight"])
  q = _ref_rope(_rms((qr @ w["wq_b.weight"].T).reshape(t, H, d)), pos, freqs)
  kv = _ref_rope(_rms(x @ w["wkv.weight"].T, w["kv_norm.weight"]), pos, freqs)
  entries = np.zeros((0, d))
  selected = [np.arange(0)] * t
  if m:
    entries = _ref_compress(w, "compressor.", x, m, d, m == 4, freqs)
    selected = [np.arange((s + 1) // m) for s in range(t)]
    if cfg.get("topk"):
      ni, di = cfg["index_heads"], cfg["index_dim"]
      qi = _ref_rope((qr @ w["indexer.wq_b.weight"].T).reshape(t, ni, di), pos, freqs)
      ki = _ref_compress(w, "indexer.compressor.", x, m, di, m == 4, freqs)
      weights = (x @ w["indexer.weights_proj.weight"].T) * di**-0.5 * ni**-0.5
      score = (np.maximum(np.einsum("tid,cd->tic", qi, ki), 0) * weights[:, :, None]).sum(1)
      selected = [v[np.argsort(-score[s, v], kind="stable")[:cfg["topk"]]]
                  for s, v in enumerate(selected)]  # ReLU ties at 0: the lower index first
  out = np.zeros((t, H, d))
  for s in range(t):
    keys = np.concatenate([kv[max(0, s - win + 1):s + 1], entries[selected[s]]])
    logits = np.einsum("hd,nd->hn", q[s], keys) * d**-0.5
    logits = np.concatenate([logits, w["attn_sink"][:, None]], axis=1)
    out[s] = _softmax(logits, 1)[:, :-1] @ keys
  out = _ref_rope(out, pos, freqs, inverse=True).reshape(t, g, -1)
  wo_a = w["wo_a.weight"].reshape(g, cfg["o_rank"], -1)
  return np.einsum("tgd,grd->tgr", out, wo_a).reshape(t, -1) @ w["wo_b.weight"].T


def _ref_weights(m, rq, g, r, ni, di, topk, seed=0):
  rng = np.random.default_rng(seed)

  def lin(out, inp):
    return rng.standard_normal((out, inp)) / np.sqrt(inp)

  def norm(n):
    return 1.0 + 0.1 * rng.standard_normal(n)

  w = {"wq_a.weight": lin(rq, E), "q_norm.weight": norm(rq), "wq_b.weight": lin(H * D, rq),
       "wkv.weight": lin(D, E), "kv_norm.weight": norm(D), "wo_a.weight": lin(g * r, H * D // g),
       "wo_b.weight": lin(E, g * r), "attn_sink": 0.5 * rng.standard_normal(H)}
  c = 2 if m == 4 else 1
  for prefix, d in (("compressor.", D), ("indexer.compressor.", di)):
    if not m or (prefix.startswith("indexer") and not topk):
      continue
    w.update({prefix + "wkv.weight": lin(c * d, E), prefix + "wgate.weight": lin(c * d, E),
              prefix + "ape": 0.5 * rng.standard_normal((m, c * d)),
              prefix + "norm.weight": norm(d)})
  if topk:
    w.update({"indexer.wq_b.weight": lin(ni * di, rq), "indexer.weights_proj.weight": lin(ni, E)})
  return w


class ReferenceLayerTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("csa_overlap_lightning_indexer", 4, 2),  # DeepSeek's CSA: M = 4, overlap, top-k
      ("hca", 8, 0),  # HCA: plain chunks (M = 128 in DeepSeek-V4; 8 here)
      ("window_only", 0, 0),  # compress_ratio 0: window + sink, main RoPE base, no YaRN
  )
  def test_reference_layer_equals_chunkformer_after_convert(self, m, topk):
    t, rq, g, r, ni, di, win = 20, 24, 2, 12, 3, 12, 3
    attn = AttentionConfig(
        kind="fixed" if m else "window", chunk_size=max(m, 1), overlap=m == 4, window=win,
        sink=True, topk=topk, layout="deepseek_v4", query_rank=rq, output_groups=g,
        output_rank=r, indexer="lightning", index_heads=ni, index_head_dim=di)
    model = _model(num_kv_heads=1, attention=attn)
    model.validate()
    weights = _ref_weights(m, rq, g, r, ni, di, topk)
    rd = model.rope_dim
    freqs = (_ref_freqs(rd, 40000.0, 4.0, 8) if m else _ref_freqs(rd, 10000.0, 1.0, 0))
    x = np.random.default_rng(7).standard_normal((t, E))
    want = _ref_layer(weights, x, dict(m=m, window=win, groups=g, o_rank=r, topk=topk,
                                       index_heads=ni, index_dim=di, freqs=freqs))
    params = jax.tree_util.tree_map(jnp.asarray, convert.attention_params(weights, model, attn))
    module = (FixedAttention if m else WindowAttention)(model, attn, 0)
    got = _apply(module, params, jnp.asarray(x[None], jnp.float32), _ctx(np.arange(t)))[0][0]
    self.assertGreater(np.abs(want).max(), 0.3)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)

  def test_convert_names_a_missing_or_misshaped_tensor(self):
    attn = AttentionConfig(kind="window", window=3, sink=True, layout="deepseek_v4",
                           query_rank=24, output_groups=2, output_rank=12)
    model = _model(num_kv_heads=1, attention=attn)
    weights = _ref_weights(0, 24, 2, 12, 0, 0, 0)
    with self.assertRaisesRegex(KeyError, "'wkv.weight'"):
      convert.attention_params({k: v for k, v in weights.items() if k != "wkv.weight"}, model,
                               attn)
    with self.assertRaisesRegex(ValueError, "'wq_a.weight': shape"):
      convert.attention_params({**weights, "wq_a.weight": weights["wq_a.weight"].T}, model, attn)
    with self.assertRaisesRegex(ValueError, "unexpected.*wq_a.scale"):
      convert.attention_params({**weights, "wq_a.scale": np.ones(1)}, model, attn)


class LightningIndexerTest(absltest.TestCase):

  def _setup(self, topk=3, t=23):
    attn = AttentionConfig(kind="fixed", chunk_size=4, overlap=True, window=2, sink=True,
                           topk=topk, layout="deepseek_v4", query_rank=24, output_groups=2,
                           output_rank=12, indexer="lightning", index_heads=3, index_head_dim=12)
    model = _model(num_kv_heads=1, attention=attn)
    return model, attn, t

  def test_indexer_selects_the_topk_visible_entries_of_its_own_scores(self):
    model, attn, t = self._setup()
    indexer = LightningIndexer(model, attn)
    rng = np.random.default_rng(0)
    x, q_r = _x(t), jnp.asarray(rng.standard_normal((1, t, 24)), jnp.float32)
    q = jnp.asarray(rng.standard_normal((1, t, H, D)), jnp.float32)
    c = math.ceil(t / 4)
    ek = jnp.asarray(rng.standard_normal((1, c, 1, D)), jnp.float32)
    visible_main = (np.arange(c)[None] + 1) * 4 - 1 <= np.arange(t)[:, None]
    visible_main = jnp.asarray(visible_main[None, :, None])
    ctx = _ctx(np.arange(t))
    args = (x, q_r, ctx, None, q, ek, visible_main)
    shapes = meta.unbox(jax.eval_shape(indexer.init, jax.random.key(0), *args)["params"])
    params = jax.tree_util.tree_map(
        lambda s: jnp.asarray(rng.standard_normal(s.shape) * 0.5, s.dtype), shapes)
    (selected, _), aux = indexer.apply({"params": params}, *args, mutable=["aux_loss"])
    scores, visible, _ = indexer.apply({"params": params}, x, q_r, ctx.positions_BxT,
                                    ctx.segment_ids_BxT, None, method=LightningIndexer.score)
    np.testing.assert_array_equal(np.asarray(visible[0]), np.asarray(visible_main[0, :, 0]))
    scores, visible = np.asarray(scores[0]), np.asarray(visible[0])
    for s in range(t):
      ids = np.flatnonzero(visible[s])
      want = set(ids[np.argsort(-scores[s, ids], kind="stable")[:attn.topk]])
      self.assertEqual(set(np.flatnonzero(np.asarray(selected[0, s, 0]))), want, f"query {s}")
    self.assertGreater(float(aux["aux_loss"]["indexer_kl"][0]), 0.0)

  def test_only_the_indexer_learns_from_its_kl_and_it_learns_nothing_else(self):
    model, attn, t = self._setup(topk=2, t=16)
    module = FixedAttention(model, attn, 0)
    x, ctx = _x(t), _ctx(np.arange(t))
    params = _random_params(module, x, ctx)

    def losses(p):
      y, aux = module.apply({"params": p}, x, ctx, {}, mutable=["aux_loss"])
      return jnp.sum(y[0] * _x(t, seed=9)), aux["aux_loss"]["indexer"]["indexer_kl"][0]

    grads = jax.jit(lambda p: [jax.grad(lambda p, i=i: losses(p)[i])(p) for i in (0, 1)])(params)
    for which, g in zip(("output", "kl"), grads, strict=True):
      norms = {k: float(sum(jnp.sum(jnp.abs(v)) for v in jax.tree_util.tree_leaves(sub)))
               for k, sub in g.items()}
      if which == "output":
        self.assertEqual(norms["indexer"], 0.0)
        self.assertGreater(norms["qkv"], 0.0)
      else:
        self.assertGreater(norms["indexer"], 0.0)
        self.assertEqual(sum(v for k, v in norms.items() if k != "indexer"), 0.0)


class ConfigTest(parameterized.TestCase):

  @parameterized.parameters(
      (dict(kind="full", layout="deepseek_v4"), "layout"),
      (dict(kind="fixed", layout="qwen3", topk=2, indexer="lightning"), "indexer"),
      (dict(kind="fixed", layout="bad"), "layout"),
      (dict(kind="fixed", layout="deepseek_v4", output_groups=3), "output_groups"),
      (dict(kind="fixed", layout="deepseek_v4", topk=2, indexer="lightning",
            index_head_dim=4), "index_head_dim"),
  )
  def test_bad_fidelity_config_names_the_field(self, attn, field):
    with self.assertRaisesRegex(ConfigError, field):
      _model(**attn).validate()


class SmallConfigTest(absltest.TestCase):

  def test_small_config_is_the_v4_pattern_with_entries_in_both_layers(self):
    from chunkformer import config as cfg_lib
    from chunkformer.data import kv
    from configs import deepseek_v4_small

    c = cfg_lib.from_dict(deepseek_v4_small.get_config().to_dict())
    csa, hca = c.model.layers
    self.assertEqual(c.model.num_kv_heads, 1)
    for layer in (csa, hca):
      self.assertEqual((layer.kind, layer.layout, layer.window, layer.sink),
                       ("fixed", "deepseek_v4", 128, True))
    self.assertEqual((csa.chunk_size, csa.overlap, csa.indexer), (4, True, "lightning"))
    self.assertGreater(csa.topk, 0)
    self.assertEqual((hca.chunk_size, hca.topk), (128, 0))
    # Every query sees a finished HCA entry (its last token <= the first QUERY token), and
    # the window does not reach the row start, so some needles are reachable only by entries.
    first_query = kv.query_start(c.data)
    self.assertLessEqual(hca.chunk_size - 1, first_query)
    self.assertGreater(first_query - hca.window, 0)


if __name__ == "__main__":
  absltest.main()
