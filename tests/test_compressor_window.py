"""The compressor family of windows W and strides S, written from its formulas.

Windows of W tokens end every S tokens: entry j pools the tokens [(j+1)S - W, (j+1)S) (those
before the row start are padding) and is visible from its last token on. Offset i of a window
has gate parameters Z_i, b_i and payload map C_i:
  s_{j,i} = Z_i h_{j,i} + b_i, alpha_{j,.} = softmax over the W offsets,
  entry_j = sum_i alpha_{j,i} * C_i h_{j,i}
(a scalar gate: one score per offset; a vector gate: one per channel; uniform averaging:
alpha = 1/W). The layer then attends with one softmax over raw tokens (the local window, or
only the current chunk's tokens with the uncompressed tail) and the visible entries.
The references below are float64 numpy loops over entries and queries.
"""


import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

from chunkformer.attention import AttentionContext
from chunkformer.attention.fixed import FixedAttention
from chunkformer.config import AttentionConfig, ModelConfig

E, H, D = 16, 4, 8


def _model(num_kv_heads=2, rope_dims=0, rope=True, qk_norm=True, **attn):
  return ModelConfig(d_model=E, num_heads=H, num_kv_heads=num_kv_heads, head_dim=D,
                     rope=rope, rope_dims=rope_dims, qk_norm=qk_norm,
                     attention=AttentionConfig(**{"kind": "fixed", **attn}))


def _ctx(t, positions=None, segment_ids=None):
  seg = np.zeros((1, t), np.int32) if segment_ids is None else np.asarray(segment_ids)[None]
  pos = np.arange(t)[None] if positions is None else np.asarray(positions)[None]
  return AttentionContext(jnp.zeros((1, t), jnp.int32), jnp.asarray(pos), jnp.asarray(seg))


def _params(module, x, ctx, seed):
  shapes = nn.meta.unbox(jax.eval_shape(module.init, jax.random.key(0), x, ctx, {})["params"])
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(lambda s: np.asarray(rng.normal(size=s.shape) * 0.5, np.float32),
                                shapes)


def _apply(module, params, x, ctx):
  return np.asarray(jax.jit(module.apply)({"params": params}, x, ctx, {})[0])


def _rms(x, scale):
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def _rotate(x, pos, rope_dims, inverse=False):
  """Half-split RoPE of the first rope_dims channels at integer position pos (Qwen3 layout)."""
  if rope_dims == 0:
    return x
  half = rope_dims // 2
  ang = pos * 10000.0 ** (-np.arange(0, rope_dims, 2) / rope_dims) * (-1 if inverse else 1)
  a, b = x[..., :half], x[..., half:rope_dims]
  return np.concatenate([a * np.cos(ang) - b * np.sin(ang), b * np.cos(ang) + a * np.sin(ang),
                         x[..., rope_dims:]], axis=-1)


def _offset_maps(comp, attn, k):
  """Per offset i: (C_i E x D, Z_i E x g or None, b_i g or None) of kv head k.

  Storage: G groups of channels, offset i in group i // (W/G); the bias table has W/G rows,
  offset i = group * (W/G) + row.
  """
  w = attn.window_tokens
  g = attn.map_groups
  gw = D if attn.gate == "vector" else 1
  maps = []
  for i in range(w):
    grp, row = divmod(i, w // g)
    c = np.float64(comp["wkv"]["kernel"][:, k, grp * D:(grp + 1) * D])
    z = b = None
    if "wgate" in comp:
      z = np.float64(comp["wgate"]["kernel"][:, k, grp * gw:(grp + 1) * gw])
    if "ape" in comp:
      b = np.float64(comp["ape"][row, k, grp * gw:(grp + 1) * gw])
    maps.append((c, z, b))
  return maps


def _entries(comp, attn, x, rope_dims, normalise):
  """entries[j, k] and their ends, from the formula (one loop per entry, head and offset)."""
  t = x.shape[0]
  s, w = attn.chunk_size, attn.window_tokens
  num = -(-t // s)
  out = np.zeros((num, len(comp["wkv"]["kernel"][0]), D))
  for k in range(out.shape[1]):
    maps = _offset_maps(comp, attn, k)
    for j in range(num):
      toks = [((j + 1) * s - w + i, i) for i in range(w) if 0 <= (j + 1) * s - w + i < t]
      pay = np.stack([x[tok] @ maps[i][0] for tok, i in toks])
      if attn.payload_norm:
        pay = _rms(pay, comp["payload_norm"]["scale"])
      if attn.pooling == "mean":
        alpha = np.full((len(toks), 1), 1.0 / len(toks))
      else:
        scores = np.stack([x[tok] @ maps[i][1] + (maps[i][2] if maps[i][2] is not None else 0)
                           for tok, i in toks])
        alpha = np.exp(scores - scores.max(0))
        alpha = alpha / alpha.sum(0)
      e = (alpha * pay).sum(0)
      if normalise:
        e = _rms(e, comp["norm"]["scale"])
      out[j, k] = _rotate(e, j * s, rope_dims)
  ends = (np.arange(num) + 1) * s - 1
  return out, ends


def dense_layer(params, model, x):
  """The fixed layer's output for one row (no documents), from the formulas."""
  a = model.attention
  p = jax.tree_util.tree_map(np.float64, params)
  x = np.float64(x[0])
  t = x.shape[0]
  rd = model.rope_dim
  kh = model.num_kv_heads
  q = np.einsum("te,ehd->thd", x, p["qkv"]["q"]["kernel"])
  k = np.einsum("te,ehd->thd", x, p["qkv"]["k"]["kernel"])
  v = np.einsum("te,ehd->thd", x, p["qkv"]["v"]["kernel"])
  if model.qk_norm:
    q, k = _rms(q, p["qkv"]["q_norm"]["scale"]), _rms(k, p["qkv"]["k_norm"]["scale"])
  pos = np.arange(t)[:, None, None]
  q, k, v = (_rotate(y, pos, rd) for y in (q, k, v))
  if a.shared_kv:
    ek, ends = _entries(p["compressor"], a, x, rd, a.entry_norm != "none")
    ev = ek
  else:
    ek, ends = _entries(p["key_compressor"], a, x, rd, a.entry_norm != "none")
    ev, _ = _entries(p["value_compressor"], a, x, rd, a.entry_norm == "all")
  o = np.zeros((t, H, D))
  for tq in range(t):
    if a.tail:  # the open chunk's tokens only
      raw = range(tq - tq % a.chunk_size, tq + 1)
    else:
      raw = range(max(0, tq - a.window + 1), tq + 1)
    seen = [c for c in range(len(ends)) if ends[c] <= tq]
    for h in range(H):
      kk = h // (H // kh)
      keys = [k[s_, kk] for s_ in raw] + [ek[c, kk] for c in seen]
      vals = [v[s_, kk] for s_ in raw] + [ev[c, kk] for c in seen]
      logits = np.array([q[tq, h] @ key for key in keys]) / np.sqrt(D)
      wts = np.exp(logits - logits.max())
      o[tq, h] = (wts / wts.sum()) @ np.stack(vals)
  o = _rotate(o, np.arange(t)[:, None, None], rd, inverse=True)
  return np.einsum("thd,hde->te", o, p["out"]["o"]["kernel"])[None]


# (W, S, T, options): random W >= S and T (drawn once, seed 0), every gate and map option.
CASES = (
    ("w6s4_scalar_per_offset_separate", 6, 4, 15,
     dict(gate="scalar", offset_maps="per_offset", shared_kv=False, window=3)),
    ("w5s3_vector_per_offset_tied", 5, 3, 13,
     dict(gate="vector", offset_maps="per_offset", shared_kv=True, window=2)),
    ("w7s2_scalar_no_bias_shared_map", 7, 2, 12,
     dict(gate="scalar", pooling="gated_no_bias", shared_kv=False, window=4)),
    ("w8s8_mean_tied_post_norm", 8, 8, 19,
     dict(pooling="mean", payload_norm=True, shared_kv=True, window=3,
          offset_maps="per_offset")),
    ("w4s4_tail_keys_norm_only", 4, 4, 14,
     dict(gate="scalar", offset_maps="per_offset", shared_kv=False, tail=True,
          entry_norm="keys")),
    ("w9s6_no_entry_norm_rope4_one_kv_head", 9, 6, 17,
     dict(gate="vector", offset_maps="per_offset", shared_kv=False, window=5,
          entry_norm="none", _model=dict(num_kv_heads=1, rope_dims=4, qk_norm=False))),
    ("w6s3_nope", 6, 3, 11,
     dict(gate="scalar", offset_maps="per_offset", window=2, _model=dict(rope=False))),
)


def _case_model(w, s, opts):
  opts = dict(opts)
  model_opts = opts.pop("_model", {})
  return _model(chunk_size=s, compress_window=w, **opts, **model_opts)


def assert_layer_equals(model, reference, t):
  """One fixed layer of ``model`` on random rows of T = t equals ``reference(params, model,
  x)`` (a float64 loop from the formulas)."""
  model.validate()
  module = FixedAttention(model, model.attention, layer=0)
  x = jnp.asarray(np.random.default_rng(t).normal(size=(1, t, E)), jnp.float32)
  ctx = _ctx(t)
  a = model.attention
  params = _params(module, x, ctx, seed=a.window_tokens * 10 + a.chunk_size)
  np.testing.assert_allclose(_apply(module, params, x, ctx), reference(params, model, x),
                             atol=2e-5, rtol=2e-5)


def assert_shift_invariant(model, t, pre):
  """Positions shifted by 2S, and ``pre`` = 2S tokens of another document in front, leave one
  fixed layer's outputs unchanged; one token more in front (off the grid) changes them."""
  s = model.attention.chunk_size
  module = FixedAttention(model, model.attention, layer=0)
  x = jnp.asarray(np.random.default_rng(5).normal(size=(1, t, E)), jnp.float32)
  params = _params(module, x, _ctx(t), seed=6)
  base = _apply(module, params, x, _ctx(t))
  shifted = _apply(module, params, x, _ctx(t, positions=np.arange(t) + 2 * s))
  np.testing.assert_allclose(shifted, base, atol=1e-5, rtol=1e-5)
  other = jnp.asarray(np.random.default_rng(7).normal(size=(1, pre, E)), jnp.float32)
  ctx = _ctx(t + pre, positions=np.r_[np.arange(pre), np.arange(t)],
             segment_ids=np.r_[np.zeros(pre), np.ones(t)].astype(np.int32))
  packed = _apply(module, params, jnp.concatenate([other, x], axis=1), ctx)
  np.testing.assert_allclose(packed[:, pre:], base, atol=1e-5, rtol=1e-5)
  ctx = _ctx(t + 1, positions=np.r_[0, np.arange(t)],
             segment_ids=np.r_[0, np.ones(t)].astype(np.int32))
  moved = _apply(module, params, jnp.concatenate([other[:, :1], x], axis=1), ctx)[:, 1:]
  assert np.abs(moved - base).max() > 1e-3


class WindowedCompressorTest(parameterized.TestCase):

  @parameterized.named_parameters(*CASES)
  def test_layer_equals_the_dense_reference(self, w, s, t, opts):
    assert_layer_equals(_case_model(w, s, opts), dense_layer, t)

  def test_scalar_gate_equals_vector_gate_whose_channels_share_one_score(self):
    t = 13
    scalar = _model(chunk_size=3, compress_window=6, gate="scalar", offset_maps="per_offset")
    vector = _model(chunk_size=3, compress_window=6, gate="vector", offset_maps="per_offset")
    x = jnp.asarray(np.random.default_rng(0).normal(size=(1, t, E)), jnp.float32)
    ctx = _ctx(t)
    m_s = FixedAttention(scalar, scalar.attention, layer=0)
    p_s = _params(m_s, x, ctx, seed=1)
    comp = p_s["compressor"]
    p_v = jax.tree_util.tree_map(lambda a: a, p_s)
    # Every one of a group's D channels gets the scalar score's column and bias.
    p_v["compressor"] = dict(comp, wgate={"kernel": np.repeat(comp["wgate"]["kernel"], D, -1)},
                             ape=np.repeat(comp["ape"], D, -1))
    m_v = FixedAttention(vector, vector.attention, layer=0)
    np.testing.assert_allclose(_apply(m_v, p_v, x, ctx), _apply(m_s, p_s, x, ctx),
                               atol=1e-6, rtol=1e-6)
    # And the shared score is not a no-op: other vector scores change the output.
    p_v["compressor"]["ape"] = p_v["compressor"]["ape"] + np.arange(D * 6, dtype=np.float32
                                                                    ).reshape(1, 1, -1)
    self.assertGreater(np.abs(_apply(m_v, p_v, x, ctx) - _apply(m_s, p_s, x, ctx)).max(), 1e-3)

  @parameterized.parameters("scalar", "vector")
  def test_one_hot_offset_gate_gives_that_offsets_payload(self, gate):
    from chunkformer.compression import Compressor  # the compressor alone: entries, no norm
    s, t, hot = 4, 14, 2
    model = _model(chunk_size=s, gate=gate, offset_maps="per_offset", rope=False,
                   entry_norm="none")
    comp = Compressor(model, model.attention, normalise=False)
    x = jnp.asarray(np.random.default_rng(3).normal(size=(1, t, E)), jnp.float32)
    shapes = nn.meta.unbox(jax.eval_shape(comp.init, jax.random.key(0), x)["params"])
    rng = np.random.default_rng(4)
    params = jax.tree_util.tree_map(lambda a: np.asarray(rng.normal(size=a.shape), np.float32),
                                    shapes)
    gw = D if gate == "vector" else 1
    params["wgate"]["kernel"] = np.zeros_like(params["wgate"]["kernel"])
    ape = np.full(params["ape"].shape, -1e4, np.float32)  # 1 row x K x (S groups * g)
    ape[:, :, hot * gw:(hot + 1) * gw] = 0.0
    params["ape"] = ape
    entries, ends = jax.jit(comp.apply)({"params": params}, x)
    kernel = params["wkv"]["kernel"]
    for j in range(t // s):
      want = np.einsum("e,ekd->kd", x[0, j * s + hot], kernel[:, :, hot * D:(hot + 1) * D])
      np.testing.assert_allclose(entries[0, j], want, atol=1e-5, rtol=1e-5)
      np.testing.assert_array_equal(ends[0, j], (j + 1) * s - 1)

  def test_shift_by_a_multiple_of_s_leaves_the_output_unchanged(self):
    # RoPE on every channel (entries and de-rotated values): positions shifted by 2S, and a
    # row that starts with 2S tokens of another document, give the same outputs.
    s, w, t, pre = 3, 5, 13, 6
    model = _model(chunk_size=s, compress_window=w, gate="scalar", offset_maps="per_offset",
                   shared_kv=False, window=2)
    assert_shift_invariant(model, t, pre)


if __name__ == "__main__":
  absltest.main()
