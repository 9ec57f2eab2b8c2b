"""Incremental decoding over compressed caches reproduces the forward pass; cache accounting."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

from chunkformer import decode
from chunkformer.config import AttentionConfig, ModelConfig
from chunkformer.model import Transformer
from tests import decoding

V, T = 32, 18  # prompt + steps cross the chunk boundaries at tokens 7, 11 and 15 (M = 4)


def _model(layer_pattern="kind=fixed;kind=window;kind=full", num_layers=3, key_shift=0,
           query_shift=False, rope=True, num_kv_heads=2, compressed_rope_base=0.0, **attn):
  return ModelConfig(vocab_size=V, num_layers=num_layers, d_model=32, num_heads=4,
                     num_kv_heads=num_kv_heads, head_dim=8, mlp_dim=64, rope=rope,
                     key_shift=key_shift, query_shift=query_shift,
                     compressed_rope_base=compressed_rope_base,
                     layer_pattern=layer_pattern,
                     attention=AttentionConfig(**{"kind": "fixed", "chunk_size": 4, "window": 3,
                                                  **attn}))


def _params(model: Transformer, seed=0):
  """Random parameters of the model's shapes (numpy: no RNG compilation)."""
  tokens = jnp.zeros((1, T), jnp.int32)
  shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), tokens)["params"])
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(lambda s: jnp.asarray(rng.normal(size=s.shape) * 0.5, s.dtype),
                                shapes)


def _tokens(batch=2, seed=1):
  return jnp.asarray(np.random.default_rng(seed).integers(0, V, (batch, T)), jnp.int32)


def _shapes(config, max_len):
  """The actual (empty) cache arrays for ``max_len`` tokens."""
  return decode.init_cache(config, 1, max_len)


class DecodeTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("full_only", dict(layer_pattern="kind=full", num_layers=2, key_shift=2), 5),
      ("overlap_rope", dict(overlap=True), 5),
      # keys and queries shifted: each decoding step's query needs the cached history too
      ("query_shift", dict(key_shift=3, query_shift=True, overlap=True), 5),
      ("staggered_heads_no_indexer", dict(stagger="heads", overlap=True, layer_pattern="",
                                          num_layers=1), 3),
      ("overlap_norope", dict(overlap=True, rope=False), 5),
      ("plain_rope", dict(overlap=False), 8),
      ("plain_norope", dict(overlap=False, rope=False), 6),
      ("staggered_separate_kv_topk_sink_shift",
       dict(overlap=True, stagger="heads", shared_kv=False, sink=True, topk=2, key_shift=3,
            chunk_offset=1, pooling="mlp", layer_pattern="", num_layers=2), 5),
      ("mean_pooling_layer_stagger", dict(pooling="mean", stagger="layers", window=0,
                                          layer_pattern="window=0;window=2"), 7),
      # DeepSeek-V4 projections (K = V ring, values rotated back), CSA with a top-k indexer,
      # window-only and HCA-like layers.
      ("deepseek_v4_layout", dict(
          layout="deepseek_v4", query_rank=16, output_groups=2, output_rank=8, sink=True,
          layer_pattern="overlap=true,topk=2;kind=window;chunk_size=8"), 5),
      ("deepseek_v4_layout_query_shift", dict(
          layout="deepseek_v4", query_rank=16, output_groups=2, output_rank=8, key_shift=2,
          query_shift=True, layer_pattern="overlap=true;kind=window"), 5),
  )
  def test_decode_matches_forward(self, config, prompt_len):
    self._check_decode_matches_forward(_model(**config), prompt_len)

  def _check_decode_matches_forward(self, config, prompt_len):
    model = Transformer(config)
    params = _params(model)
    tokens = _tokens()
    got, expected, cache = decoding.decoded_and_forward(model, params, tokens, prompt_len, T)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)
    self.assertEqual(int(decode.cache_index(cache)), T)
    return model, params, tokens, expected, cache

  def test_lightning_indexer_decode_matches_forward(self):
    # configs/deepseek_v4_small.py's layers in miniature: V4 layout, MQA, sink, key shift, own
    # RoPE base; CSA (M = 4, overlap, lightning top-2) then HCA (M = 8, every entry).
    config = _model(layout="deepseek_v4", query_rank=16, output_groups=2, output_rank=8,
                    sink=True, key_shift=2, num_kv_heads=1, compressed_rope_base=160000.0,
                    indexer="lightning", index_heads=2, index_head_dim=8, num_layers=2,
                    layer_pattern="overlap=true,topk=2;chunk_size=8")
    model, params, tokens, expected, cache = self._check_decode_matches_forward(config, 6)
    # The indexer's own entries are cached (4 chunks closed by T = 18), and top-2 of them
    # really drops entries: keeping every entry changes the logits.
    index_entries = np.asarray(cache["block_0"]["attn"]["state"]["entries_index"])
    self.assertEqual(index_entries.shape[1:], (T // 4 + 1, 1, 8))
    self.assertTrue(np.all(np.abs(index_entries[:, :4]).sum(-1) > 0))
    every = dataclasses.replace(config, layer_pattern="overlap=true,topk=8;chunk_size=8")
    unselected = jax.jit(Transformer(every).apply)({"params": params}, tokens)
    self.assertGreater(float(jnp.abs(unselected - expected).max()), 1e-3)

  def test_generate_is_greedy_over_the_forward_pass(self):
    model = Transformer(_model(overlap=True))
    params = _params(model, seed=3)
    prompt = _tokens()[:, :6]
    generated = decode.generate(model, params, prompt, num_tokens=8, max_len=16)
    full = jnp.concatenate([prompt, generated], axis=1)
    logits = jax.jit(model.apply)({"params": params}, full)
    np.testing.assert_array_equal(jnp.argmax(logits[:, 5:-1], axis=-1), generated)

  @parameterized.parameters(dict(shared_kv=False, overlap=False), dict(shared_kv=True),
                            dict(shared_kv=False, overlap=True, pooling="mean"))
  def test_compressed_bytes_per_token_are_full_over_m_plus_window_constant(self, **attn):
    m = 4
    compressed = _model(layer_pattern="", num_layers=2, **attn)
    full = dataclasses.replace(compressed, attention=AttentionConfig(kind="full"))
    lengths = (64, 128, 256)  # multiples of M
    sizes = {name: [decode.cache_bytes(_shapes(cfg, n))
                    for n in lengths] for name, cfg in (("full", full), ("fixed", compressed))}
    slope = {name: (s[2] - s[1]) / (lengths[2] - lengths[1]) for name, s in sizes.items()}
    for s in sizes.values():  # exactly affine in the context length
      self.assertEqual((s[1] - s[0]) / (lengths[1] - lengths[0]), (s[2] - s[1]) / (lengths[2]
                                                                                  - lengths[1]))
    streams = 1 if attn["shared_kv"] else 2  # one shared vector is half of key + value
    self.assertEqual(slope["fixed"], slope["full"] / m * streams / 2)
    # The constant: the ring of W raw keys/values, the open (and previous) chunk's buffers and
    # one spare entry row per stream (any offset < M), counted from the actual arrays.
    cache = _shapes(compressed, lengths[0])
    constant = sizes["fixed"][0] - slope["fixed"] * lengths[0]
    arrays = [a for layer in cache.values() for name, a in layer["attn"]["state"].items()
              if not name.startswith("entries_")]
    spare = [a.nbytes // a.shape[1] for layer in cache.values()
             for name, a in layer["attn"]["state"].items() if name.startswith("entries_")]
    self.assertEqual(constant, sum(a.size * a.dtype.itemsize for a in arrays) + sum(spare))
    ring = sum(layer["attn"]["state"]["ring_k"].nbytes * 2 for layer in cache.values())
    self.assertEqual(ring, 2 * 3 * 2 * 8 * 4 * 2)  # layers x W x K x D x fp32 x (k, v)


if __name__ == "__main__":
  absltest.main()
