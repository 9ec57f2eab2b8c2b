"""Windows W and strides S in the model: decoding, the Pallas kernels, the config's refusals."""

import dataclasses
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

from chunkformer import workdir as workdir_lib
from chunkformer.config import AttentionConfig, Config, ConfigError, ModelConfig
from chunkformer.model import Transformer
from tests import decoding

V, T = 32, 19


def _model(num_kv_heads=2, rope=True, rope_dims=0, qk_norm=True, num_layers=2, **attn):
  return ModelConfig(vocab_size=V, num_layers=num_layers, d_model=32, num_heads=4,
                     num_kv_heads=num_kv_heads, head_dim=8, mlp_dim=64, rope=rope,
                     rope_dims=rope_dims, qk_norm=qk_norm,
                     attention=AttentionConfig(**{"kind": "fixed", **attn}))


def _params(model, seed=0, seq_len=T):
  shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0),
                                        jnp.zeros((1, seq_len), jnp.int32))["params"])
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(lambda s: jnp.asarray(rng.normal(size=s.shape) * 0.5, s.dtype),
                                shapes)


def _tokens(batch=2, seed=1):
  return jnp.asarray(np.random.default_rng(seed).integers(0, V, (batch, T)), jnp.int32)


PAPER = dict(gate="scalar", offset_maps="per_offset", shared_kv=False)

# Each of the sweep's switches at a general W / S (stride 3 or 4, windows up to 2.5 S).
DECODE_CASES = (
    ("w6s4_scalar_per_offset", dict(chunk_size=4, compress_window=6, window=3, **PAPER), 6),
    ("w5s3_vector_stagger_heads", dict(chunk_size=3, compress_window=5, window=2,
                                       offset_maps="per_offset", stagger="heads"), 4),
    ("w8s3_tied_kv_mean_post_norm", dict(chunk_size=3, compress_window=8, window=2,
                                         pooling="mean", payload_norm=True,
                                         offset_maps="per_offset"), 7),
    ("w4s4_tail", dict(chunk_size=4, tail=True, **PAPER), 5),
    ("w6s3_tail_offset_one_kv_head", dict(chunk_size=3, compress_window=6, tail=True,
                                          chunk_offset=1, num_kv_heads=1, **PAPER), 8),
    ("w7s4_no_qk_norm_no_gate_bias", dict(chunk_size=4, compress_window=7, window=2,
                                          qk_norm=False, entry_norm="none",
                                          pooling="gated_no_bias", **PAPER), 6),
    ("w6s4_rope_on_4_dims", dict(chunk_size=4, compress_window=6, window=3, rope_dims=4,
                                 **PAPER), 5),
    ("w6s4_no_rope_one_kv_head", dict(chunk_size=4, compress_window=6, window=3, rope=False,
                                      num_kv_heads=1, **PAPER), 5),
)


class WindowedModelTest(parameterized.TestCase):

  @parameterized.named_parameters(*DECODE_CASES)
  def test_decode_matches_forward(self, attn, prompt_len):
    model_keys = {"num_kv_heads", "rope", "rope_dims", "qk_norm"}
    config = _model(**{k: v for k, v in attn.items() if k in model_keys},
                    **{k: v for k, v in attn.items() if k not in model_keys})
    config.validate()
    model = Transformer(config)
    params = _params(model)
    tokens = _tokens()
    got, expected, _ = decoding.decoded_and_forward(model, params, tokens, prompt_len, T)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)

  def test_pallas_interpret_equals_xla_for_general_windows(self):
    # The kernels read entries with one end each; a window of W tokens every S is such an
    # entry, so they take W > S (and non-divisible strides) without any change.
    xla = _model(chunk_size=3, compress_window=8, window=2, sink=True, **PAPER)
    pallas = dataclasses.replace(xla, attention=dataclasses.replace(
        xla.attention, implementation="pallas_gpu", interpret=True))
    pallas.validate()
    params = _params(Transformer(xla), seed=2)
    tokens = _tokens(seed=3)
    segment_ids = jnp.asarray([[0] * 11 + [1] * 8, [0] * T])
    want = jax.jit(Transformer(xla).apply)({"params": params}, tokens, None, segment_ids)
    got = jax.jit(Transformer(pallas).apply)({"params": params}, tokens, None, segment_ids)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)

  def test_tail_sees_only_the_open_chunk(self):
    # Query t's output depends on raw token s < t only through entries, so a token of a
    # closed chunk changes nothing before its entry becomes visible... and the tail's tokens
    # do change the output at once.
    config = _model(chunk_size=4, tail=True, num_layers=1, **PAPER)
    model = Transformer(config)
    params = _params(model, seed=4)
    tokens = _tokens(batch=1)
    base = jax.jit(model.apply)({"params": params}, tokens)
    changed = jax.jit(model.apply)({"params": params}, tokens.at[0, 5].set((tokens[0, 5] + 1) % V))
    diff = np.abs(np.asarray(changed - base)).max(-1)[0]
    np.testing.assert_array_equal(diff[:5], 0)
    self.assertTrue(np.all(diff[5:] > 0))  # 5, 6, 7 through the tail; 8+ through the entry
    # Raw token 5 is in the tail of queries 5..7 only: with its entry pooled away (a window
    # whose only weight is on offset 0, token 4), queries from 8 on no longer see it.
    comp = params["block_0"]["attn"]
    hot = {}
    for name in ("key_compressor", "value_compressor"):
      ape = np.full(comp[name]["ape"].shape, -1e4, np.float32)
      ape[:, :, 0] = 0.0
      hot[name] = dict(comp[name], ape=jnp.asarray(ape),
                       wgate={"kernel": jnp.zeros_like(comp[name]["wgate"]["kernel"])})
    params_hot = dict(params, block_0=dict(params["block_0"], attn=dict(comp, **hot)))
    base = jax.jit(model.apply)({"params": params_hot}, tokens)
    changed = jax.jit(model.apply)({"params": params_hot},
                                   tokens.at[0, 5].set((tokens[0, 5] + 1) % V))
    diff = np.abs(np.asarray(changed - base)).max(-1)[0]
    self.assertTrue(np.all(diff[5:8] > 0))
    np.testing.assert_allclose(diff[8:], 0, atol=1e-6)

  @parameterized.named_parameters(
      ("window_below_stride", dict(chunk_size=4, compress_window=3), "compress_window"),
      ("window_negative", dict(compress_window=-1), "compress_window"),
      ("stride_zero", dict(chunk_size=0), "chunk_size"),
      ("unknown_gate", dict(gate="matrix"), "gate"),
      ("unknown_maps", dict(offset_maps="per_token"), "offset_maps"),
      ("unknown_entry_norm", dict(entry_norm="values"), "entry_norm"),
      ("tail_with_window", dict(tail=True, window=16), "tail"),
      ("tail_with_pallas", dict(tail=True, implementation="pallas_gpu"), "tail"),
      ("overlap_other_window", dict(overlap=True, chunk_size=4, compress_window=12),
       "compress_window"),
      ("window_on_dynamic", dict(kind="dynamic", compress_window=8, boundary="fixed"),
       "compress_window"),
  )
  def test_bad_window_config_names_the_field(self, attn, field):
    with self.assertRaisesRegex(ConfigError, rf"model\.attention\[layer 0\]\.{field}"):
      Config(model=_model(**attn)).validate()

  @parameterized.named_parameters(("odd", 5), ("above_head_dim", 10), ("negative", -2))
  def test_bad_rope_dims_names_the_field(self, dims):
    with self.assertRaisesRegex(ConfigError, r"model\.rope_dims"):
      Config(model=_model(rope_dims=dims)).validate()

  def test_defaults_keep_the_earlier_compressor(self):
    # W = S with one shared map (and CSA's W = 2S with one map per half): the parameter
    # shapes of runs written before W, S and the gate options existed.
    for overlap, w, groups in ((False, 4, 1), (True, 8, 2)):
      attn = AttentionConfig(kind="fixed", chunk_size=4, overlap=overlap)
      self.assertEqual((attn.window_tokens, attn.map_groups), (w, groups))
    params = _params(Transformer(_model(chunk_size=4, overlap=True)))["block_0"]["attn"]
    comp = params["compressor"]
    self.assertEqual(comp["wkv"]["kernel"].shape, (32, 2, 16))
    self.assertEqual(comp["ape"].shape, (4, 2, 16))
    self.assertEqual(set(comp), {"wkv", "wgate", "ape", "norm"})

  def test_committed_run_records_read_back_as_the_compressor_they_trained(self):
    # Records written before W, S and the gate options existed get today's defaults, which
    # are the compressor they trained with: W = S, one shared map, vector gates, every entry
    # normalised, the local window, RoPE from rope_fraction.
    root = os.path.join(os.path.dirname(__file__), os.pardir, "results", "study")
    for variant in ("fixed_m4_seed0", "fixed_m4_mean_seed0", "fixed_m8_seed0"):
      recorded = workdir_lib.read_config(os.path.join(root, variant))
      a = recorded.model.attention
      self.assertEqual((a.window_tokens, a.stride, a.map_groups), (a.chunk_size,) * 2 + (1,))
      self.assertEqual((a.gate, a.entry_norm, a.payload_norm, a.tail), ("vector", "all", False,
                                                                        False))
      self.assertEqual((a.compress_window_align, a.align_offset), ("end", 0))
      self.assertEqual(recorded.model.rope_dim,
                       int(round(recorded.model.head_dim * recorded.model.rope_fraction / 2)) * 2)


if __name__ == "__main__":
  absltest.main()
