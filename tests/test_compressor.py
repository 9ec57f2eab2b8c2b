"""The DeepSeek-V4 compressor against a direct loop over chunks written from the formula."""

import itertools
import math

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

from chunkformer.compression import (
  Compressor,
  chunk_offsets,
  pool_weights,
  slot_biases,
  static_offsets,
)
from chunkformer.config import AttentionConfig, ModelConfig
from chunkformer.layers import Rope, apply_rope
from chunkformer.model import Transformer

B, T, E, K, D, M = 2, 13, 16, 2, 8, 4


def _model(**attn):
  return ModelConfig(d_model=E, num_heads=2 * K, num_kv_heads=K, head_dim=D,
                     attention=AttentionConfig(kind="fixed", chunk_size=M, **attn))


def _loop_reference(params, x, attn, offsets, rope_dim):
  """Entries [b, i, k] by the formula, one chunk, head and channel at a time (float64)."""
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
  x = np.asarray(x, np.float64)
  kv = np.einsum("bte,ekr->btkr", x, p["wkv"]["kernel"])
  z = np.einsum("bte,ekr->btkr", x, p["wgate"]["kernel"]) if "wgate" in p else None
  c = math.ceil(T / M)
  out = np.zeros((B, c, K, D))
  positions = np.zeros((B, c, K), np.int64)
  for b, i, k in itertools.product(range(B), range(c), range(K)):
    o = int(offsets[b, k])
    # (token, channel offset, slot-bias row) of every slot of entry i.
    slots = [(i * M + j - o, 0, j) for j in range(M)]
    if attn.overlap:
      slots = [((i - 1) * M + j - o, 0, j) for j in range(M)] + [
          (i * M + j - o, D, j) for j in range(M)]
    valid = [0 <= tok < T for tok, _, _ in slots]
    if attn.pooling == "mlp":
      vec = []
      for (tok, off, j), ok in zip(slots, valid, strict=True):
        vals = kv[b, tok, k, off:off + D] + p["slot_embedding"][j, k, off:off + D] if ok else 0
        vec.append(np.zeros(D) + vals)
      h = np.maximum(np.concatenate(vec) @ p["mlp_in"][k], 0)
      out[b, i, k] = h @ p["mlp_out"][k]
    else:
      for ch in range(D):
        vals, scores = [], []
        for (tok, off, j), ok in zip(slots, valid, strict=True):
          if not ok:
            continue
          vals.append(kv[b, tok, k, off + ch])
          if attn.pooling == "mean":
            scores.append(0.0)
          else:
            bias = p["ape"][j, k, off + ch] if attn.pooling == "gated" else 0.0
            scores.append(z[b, tok, k, off + ch] + bias)
        w = np.exp(np.array(scores) - max(scores))
        out[b, i, k, ch] = np.dot(w / w.sum(), vals)
    positions[b, i, k] = i * M - o
  out = out / np.sqrt(np.mean(out**2, axis=-1, keepdims=True) + 1e-6) * p["norm"]["scale"]
  rotated = apply_rope(jnp.asarray(out.reshape(B, c * K, 1, D), jnp.float32),
                       jnp.asarray(positions.reshape(B, c * K)), Rope(rope_dim, 10000.0))
  return np.asarray(rotated).reshape(B, c, K, D)


class CompressorTest(parameterized.TestCase):

  @parameterized.product(pooling=("gated", "gated_no_bias", "mean", "mlp"), overlap=(False, True))
  def test_compressor_equals_loop_over_chunks(self, pooling, overlap):
    model = _model(pooling=pooling, overlap=overlap)
    comp = Compressor(model, model.attention)
    x = jax.random.normal(jax.random.key(0), (B, T, E))
    params = comp.init(jax.random.key(1), x)["params"]
    params = nn.meta.unbox(params)
    if "ape" in params:  # a non-trivial slot bias
      params["ape"] = jax.random.normal(jax.random.key(2), params["ape"].shape)
    for offsets in (None, jnp.array([[1, 3], [2, 0]])):
      entries, ends = comp.apply({"params": params}, x, offsets_BxK=offsets)
      o = np.zeros((B, K), int) if offsets is None else np.asarray(offsets)
      expected = _loop_reference(params, x, model.attention, o, model.rope_dim)
      np.testing.assert_allclose(entries, expected, atol=1e-5, rtol=1e-5)
      j = np.arange(ends.shape[1])[None, :, None]
      np.testing.assert_array_equal(ends, (j + 1) * M - 1 - o[:, None, :])

  def test_pool_weights_are_sown_per_slot_and_normalised(self):
    model = _model(pooling="gated", overlap=True)
    comp = Compressor(model, model.attention)
    x = jax.random.normal(jax.random.key(0), (B, T, E))
    variables = comp.init(jax.random.key(1), x)
    _, sown = comp.apply(variables, x, mutable=["intermediates"])
    (w,) = sown["intermediates"]["pool_weights"]
    chex.assert_shape(w, (B, math.ceil(T / M), 2 * M, K))
    np.testing.assert_allclose(w.sum(axis=2), 1.0, atol=1e-6)
    np.testing.assert_array_equal(w[:, 0, :M], 0.0)  # chunk -1 is padding

  def test_probes_read_every_compressor_of_a_model(self):
    model = ModelConfig(vocab_size=16, num_layers=2, d_model=E, num_heads=2 * K, num_kv_heads=K,
                        head_dim=D, mlp_dim=32, layer_pattern="overlap=true;shared_kv=false",
                        attention=AttentionConfig(kind="fixed", chunk_size=M, window=2))
    net = Transformer(model)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 16, (B, T)))
    shapes = jax.eval_shape(net.init, jax.random.key(0), tokens)["params"]
    rng = np.random.default_rng(0)  # numpy: Flax's init would compile its RNG (seconds)
    params = jax.tree_util.tree_map(
        lambda s: jnp.asarray(rng.normal(size=s.shape) * 0.5, s.dtype), nn.meta.unbox(shapes))
    biases = slot_biases(params)
    self.assertEqual({k: v.shape for k, v in biases.items()},
                     {"block_0/attn/compressor": (M, K, 2 * D),
                      "block_1/attn/key_compressor": (M, K, D),
                      "block_1/attn/value_compressor": (M, K, D)})
    weights = pool_weights(net, params, tokens)
    self.assertEqual(set(weights), set(biases))
    chex.assert_shape(weights["block_0/attn/compressor"], (B, math.ceil(T / M), 2 * M, K))
    np.testing.assert_allclose(weights["block_1/attn/key_compressor"].sum(axis=2), 1.0,
                               atol=1e-6)

  def test_offsets_stagger_heads_layers_and_random_phase(self):
    m8 = ModelConfig(num_layers=4, num_kv_heads=4, num_heads=4, d_model=16, head_dim=4)
    attn = AttentionConfig(kind="fixed", chunk_size=8, stagger="heads", chunk_offset=1)
    np.testing.assert_array_equal(static_offsets(m8, attn, 0), [1, 3, 5, 7])
    attn = AttentionConfig(kind="fixed", chunk_size=8, stagger="layers")
    self.assertEqual([int(static_offsets(m8, attn, layer)[0]) for layer in range(4)],
                     [0, 2, 4, 6])
    attn = AttentionConfig(kind="fixed", chunk_size=8, random_phase=True)
    self.assertIsNone(chunk_offsets(m8, attn, 0, batch=3))
    phases = chunk_offsets(m8, attn, 0, batch=64, rng=jax.random.key(0))
    self.assertTrue(bool(jnp.all(phases == phases[:, :1])))  # one phase per row
    self.assertEqual(set(np.asarray(phases[:, 0]).tolist()), set(range(8)))


if __name__ == "__main__":
  absltest.main()
