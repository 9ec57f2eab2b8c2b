"""The paper's window alignment (``compress_window_align = "start"``), from its formulas.

Entry j pools the tokens [jS, jS + W) (j >= 0: no window reaches before token 0) and is
visible from its last token jS + W - 1 on; its RoPE position is jS. Offset i of a window has
gate parameters Z_i, b_i and payload map C_i:
  s_{j,i} = Z_i h_{jS+i} + b_i, alpha_{j,.} = softmax over the W offsets,
  entry_j = sum_i alpha_{j,i} * C_i h_{jS+i}.
The layer attends with one softmax over raw tokens and the visible entries. Raw tokens: the
local window, or the uncompressed tail = the query's own chunk (the tokens after the newest
entry end before t; at an entry's last token, that entry's last S tokens) plus every token no
visible entry covers yet. The reference below is a float64 numpy loop over entries and queries
(the end-aligned layout's reference is tests/test_compressor_window.py).
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

from chunkformer.compression import Compressor, fixed_chunks
from chunkformer.config import AttentionConfig, Config, ConfigError, ModelConfig
from chunkformer.model import Transformer
from tests import decoding
from tests import test_compressor_window_model as window_model_test
from tests.test_compressor_window import (
  D,
  E,
  H,
  _model,
  _offset_maps,
  _rms,
  _rotate,
  assert_layer_equals,
  assert_shift_invariant,
)


def _paper_entries(comp, attn, x, rope_dims, normalise):
  """{end: entry_KxD} of the windows [jS, jS + W) that end inside the row."""
  t = x.shape[0]
  s, w = attn.chunk_size, attn.window_tokens
  kh = comp["wkv"]["kernel"].shape[1]
  out = {}
  for j in range(t):
    if j * s + w > t:
      break
    e_k = np.zeros((kh, D))
    for k in range(kh):
      maps = _offset_maps(comp, attn, k)
      h = [x[j * s + i] for i in range(w)]
      pay = np.stack([h[i] @ maps[i][0] for i in range(w)])
      if attn.payload_norm:
        pay = _rms(pay, comp["payload_norm"]["scale"])
      if attn.pooling == "mean":
        alpha = np.full((w, 1), 1.0 / w)
      else:
        scores = np.stack([h[i] @ maps[i][1] + (0 if maps[i][2] is None else maps[i][2])
                           for i in range(w)])
        alpha = np.exp(scores - scores.max(0))
        alpha = alpha / alpha.sum(0)
      e = (alpha * pay).sum(0)
      if normalise:
        e = _rms(e, comp["norm"]["scale"])
      e_k[k] = _rotate(e, j * s, rope_dims)
    out[j * s + w - 1] = e_k
  return out


def _raw_keys(attn, tq, ends):
  """Raw key indices query tq sees (module docstring)."""
  s, w = attn.chunk_size, attn.window_tokens
  if not attn.tail:
    return list(range(max(0, tq - attn.window + 1), tq + 1))
  own = tq - (tq - w) % s  # one past the newest entry end before tq
  covered = max([e for e in ends if e <= tq], default=-1)  # windows are contiguous: [0, e]
  return [u for u in range(tq + 1) if u >= own or u > covered]


def paper_layer(params, model, x):
  """The fixed layer's output for one row, windows [jS, jS + W) (module docstring)."""
  a = model.attention
  p = jax.tree_util.tree_map(np.float64, params)
  x = np.float64(x[0])
  t, rd, kh = x.shape[0], model.rope_dim, model.num_kv_heads
  q, k, v = (np.einsum("te,ehd->thd", x, p["qkv"][n]["kernel"]) for n in "qkv")
  if model.qk_norm:
    q, k = _rms(q, p["qkv"]["q_norm"]["scale"]), _rms(k, p["qkv"]["k_norm"]["scale"])
  q, k, v = (_rotate(y, np.arange(t)[:, None, None], rd) for y in (q, k, v))
  if a.shared_kv:
    ek = ev = _paper_entries(p["compressor"], a, x, rd, a.entry_norm != "none")
  else:
    ek = _paper_entries(p["key_compressor"], a, x, rd, a.entry_norm != "none")
    ev = _paper_entries(p["value_compressor"], a, x, rd, a.entry_norm == "all")
  o = np.zeros((t, H, D))
  for tq in range(t):
    raw = _raw_keys(a, tq, list(ek))
    seen = [e for e in ek if e <= tq]
    for h in range(H):
      kk = h // (H // kh)
      keys = [k[u, kk] for u in raw] + [ek[e][kk] for e in seen]
      vals = [v[u, kk] for u in raw] + [ev[e][kk] for e in seen]
      logits = np.array([q[tq, h] @ key for key in keys]) / np.sqrt(D)
      wts = np.exp(logits - logits.max())
      o[tq, h] = (wts / wts.sum()) @ np.stack(vals)
  o = _rotate(o, np.arange(t)[:, None, None], rd, inverse=True)
  return np.einsum("thd,hde->te", o, p["out"]["o"]["kernel"])[None]


_OPTIONS = (dict(gate="scalar", offset_maps="per_offset", shared_kv=False, window=3),
            dict(gate="vector", offset_maps="per_offset", shared_kv=True, window=2,
                 payload_norm=True, entry_norm="keys"),
            dict(pooling="mean", shared_kv=False, tail=True, entry_norm="keys"))


def _random_cases(count, seed):
  """(name, W, S, T, options): W >= S and T drawn at random, the options cycled."""
  rng = np.random.default_rng(seed)
  cases = []
  for i in range(count):
    s = int(rng.integers(2, 7))
    w = s + int(rng.integers(0, 2 * s))
    t = int(rng.integers(w + s, w + 3 * s + 1))
    cases.append((f"w{w}s{s}_t{t}_{i}", w, s, t, _OPTIONS[i]))
  return tuple(cases)


def _start(w, s, **opts):
  return _model(chunk_size=s, compress_window=w, compress_window_align="start", **opts)


class PaperAlignmentLayerTest(parameterized.TestCase):

  @parameterized.named_parameters(
      *_random_cases(2, seed=2),
      ("w8s6_mean_tail_reaches_back", 8, 6, 17, _OPTIONS[2]))
  def test_layer_equals_the_paper_reference(self, w, s, t, opts):
    assert_layer_equals(_start(w, s, **opts), paper_layer, t)

  def test_one_hot_offset_gate_gives_the_payload_of_token_js_plus_i(self):
    s, w, t, hot = 3, 7, 17, 5
    model = _start(w, s, gate="scalar", offset_maps="per_offset", rope=False, entry_norm="none")
    comp = Compressor(model, model.attention, normalise=False)
    x = jnp.asarray(np.random.default_rng(3).normal(size=(1, t, E)), jnp.float32)
    shapes = nn.meta.unbox(jax.eval_shape(comp.init, jax.random.key(0), x)["params"])
    rng = np.random.default_rng(4)
    params = jax.tree_util.tree_map(lambda a: np.asarray(rng.normal(size=a.shape), np.float32),
                                    shapes)
    params["wgate"]["kernel"] = np.zeros_like(params["wgate"]["kernel"])
    params["ape"] = np.full(params["ape"].shape, -1e4, np.float32)  # 1 row x K x W offsets
    params["ape"][:, :, hot] = 0.0
    entries, ends = jax.jit(comp.apply)({"params": params}, x)
    kernel = params["wkv"]["kernel"]
    found = 0
    for c in range(ends.shape[1]):
      end = int(ends[0, c, 0])
      if end >= t:  # padding: dropped window or not finished in the row
        continue
      j, rest = divmod(end - (w - 1), s)
      self.assertEqual((rest, j >= 0), (0, True))  # windows start on multiples of S
      want = np.einsum("e,ekd->kd", x[0, j * s + hot], kernel[:, :, hot * D:(hot + 1) * D])
      np.testing.assert_allclose(entries[0, c], want, atol=1e-5, rtol=1e-5)
      found += 1
    self.assertEqual(found, (t - w) // s + 1)  # every window [jS, jS + W) inside the row

  @parameterized.parameters((4, None), (3, [[0] * 6 + [1] * 8]))
  def test_w_equal_s_is_the_end_layout_on_rows_that_start_on_the_grid(self, s, segment_ids):
    # W = S: no window reaches before token 0, so both alignments give the same entries
    # (a document starting at 2S included; one starting inside a chunk would differ).
    t = 14
    seg = None if segment_ids is None else jnp.asarray(segment_ids)
    self.assertEqual(AttentionConfig(chunk_size=s, compress_window_align="start").align_offset,
                     0)
    end = fixed_chunks(t, s, None, 1, 2, None, seg, s, "end")
    start = fixed_chunks(t, s, None, 1, 2, None, seg, s, "start")
    for name in ("ends_BxCxK", "positions_BxCxK", "window_tok_BxCxWxK", "window_valid_BxCxWxK"):
      np.testing.assert_array_equal(getattr(start, name), getattr(end, name), err_msg=name)
    kept = (np.zeros((1, -(-t // s), 2), np.int32) if seg is None  # every entry, one document
            else end.segment_ids_BxCxK)
    np.testing.assert_array_equal(start.segment_ids_BxCxK, kept)

  def test_shift_by_a_multiple_of_s_leaves_the_output_unchanged(self):
    # RoPE on every channel: positions shifted by 2S, and a row that starts with 2S tokens of
    # another document (whose windows the later document's never mix with), change nothing;
    # the tail reaches back to the later document's start until its first window closes.
    s, w, t, pre = 3, 7, 16, 6
    model = _start(w, s, gate="scalar", offset_maps="per_offset", shared_kv=False, tail=True)
    assert_shift_invariant(model, t, pre)


V, T = 32, 19
PAPER = dict(gate="scalar", offset_maps="per_offset", shared_kv=False,
             compress_window_align="start")


def _transformer_config(num_kv_heads=2, **attn):
  return ModelConfig(vocab_size=V, num_layers=1, d_model=32, num_heads=4,
                     num_kv_heads=num_kv_heads, head_dim=8, mlp_dim=64,
                     attention=AttentionConfig(**{"kind": "fixed", **attn}))


def _model_params(model, seed=0):
  return window_model_test._params(model, seed, seq_len=T)


class PaperAlignmentModelTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("w8s6_window_stagger_heads_topk", dict(chunk_size=6, compress_window=8, window=3,
                                              stagger="heads", topk=1, **PAPER), 5),
      ("w10s4_tail_offset", dict(chunk_size=4, compress_window=10, tail=True, chunk_offset=1,
                                 **PAPER), 6),
  )
  def test_decode_matches_forward(self, attn, prompt_len):
    config = _transformer_config(**attn)
    config.validate()
    model = Transformer(config)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, V, (2, T)), jnp.int32)
    got, expected, _ = decoding.decoded_and_forward(model, _model_params(model), tokens,
                                                    prompt_len, T)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)

  def test_pallas_interpret_equals_xla(self):
    # Dropped windows are entries of no document: the kernels need no new code for them.
    xla = _transformer_config(chunk_size=6, compress_window=8, window=2, sink=True, **PAPER)
    pallas = dataclasses.replace(xla, attention=dataclasses.replace(
        xla.attention, implementation="pallas_gpu", interpret=True))
    pallas.validate()
    params = _model_params(Transformer(xla), seed=2)
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, V, (2, T)), jnp.int32)
    segment_ids = jnp.asarray([[0] * 9 + [1] * 10, [0] * T])
    want = jax.jit(Transformer(xla).apply)({"params": params}, tokens, None, segment_ids)
    got = jax.jit(Transformer(pallas).apply)({"params": params}, tokens, None, segment_ids)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)

  @parameterized.named_parameters(
      ("unknown_align", dict(compress_window_align="middle")),
      ("align_on_dynamic", dict(kind="dynamic", boundary="fixed", compress_window_align="start")))
  def test_bad_alignment_names_the_field(self, attn):
    with self.assertRaisesRegex(ConfigError, r"model\.attention\[layer 0\]\.compress_window_align"):
      Config(model=_transformer_config(**attn)).validate()


if __name__ == "__main__":
  absltest.main()
