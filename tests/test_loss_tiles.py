"""The tiled cross-entropy equals the plain head's loss, metrics and gradients.

The reference is today's path: the model's logits_BxTxV through optax's cross-entropy
(objective.metric_sums); the tiled path walks tokens in tiles that do not divide T, on a model
with packed documents, a partial loss mask and near/far groups, tied and untied heads.
"""

import dataclasses

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from chunkformer import loss_tiles, objective
from chunkformer.config import ConfigError, ModelConfig
from chunkformer.model import Transformer

V, T, B = 53, 21, 2


def _cross_entropy_dense(x, w, y, scale):
  """The textbook loss from its formula: log-sum-exp minus the target logit."""
  logits = (x @ w.T) * scale
  return jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, y[..., None], -1)[..., 0]


def test_tiled_cross_entropy_values_and_gradients_equal_the_formula():
  kx, kw, ky, kg = jax.random.split(jax.random.PRNGKey(0), 4)
  x = jax.random.normal(kx, (B, T, 8))
  w = jax.random.normal(kw, (V, 8))
  y = jax.random.randint(ky, (B, T), 0, V)
  g = jax.random.uniform(kg, (B, T))  # a weighted sum: every token's cotangent differs
  ce, correct = jax.jit(lambda x, w: loss_tiles.cross_entropy(x, w, y, tile=4, scale=0.5))(x, w)
  np.testing.assert_allclose(ce, _cross_entropy_dense(x, w, y, 0.5), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(correct, (jnp.argmax(x @ w.T, -1) == y).astype(jnp.float32))
  tiled = jax.jit(jax.grad(lambda x, w: jnp.sum(g * loss_tiles.cross_entropy(
      x, w, y, tile=4, scale=0.5)[0]), argnums=(0, 1)))(x, w)
  plain = jax.grad(lambda x, w: jnp.sum(g * _cross_entropy_dense(x, w, y, 0.5)),
                   argnums=(0, 1))(x, w)
  for a, b in zip(tiled, plain, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _batch():
  rng = np.random.default_rng(0)
  segment_ids = np.repeat(np.array([[0] * 9 + [1] * 12, [3] * 21]), 1, axis=0)
  mask = (rng.random((B, T)) < 0.7).astype(np.float32)
  near = mask * (rng.random((B, T)) < 0.5)
  return {"inputs": rng.integers(0, V, (B, T), dtype=np.int32),
          "targets": rng.integers(0, V, (B, T), dtype=np.int32),
          "positions": np.concatenate([np.arange(9), np.arange(12)])[None].repeat(B, 0)
          .astype(np.int32),
          "segment_ids": segment_ids.astype(np.int32), "loss_mask": mask,
          "near_mask": near, "far_mask": mask - near}


def test_loss_fn_tiled_equals_plain_in_loss_metrics_and_gradients():
  model_cfg = ModelConfig(vocab_size=V, num_layers=1, d_model=16, num_heads=2, num_kv_heads=1,
                          head_dim=8, mlp_dim=32, loss_token_tile=0)
  plain_model = Transformer(model_cfg)
  tiled_model = Transformer(dataclasses.replace(model_cfg, loss_token_tile=5))
  batch = {k: jnp.asarray(v) for k, v in _batch().items()}
  params = nn.meta.unbox(plain_model.init(jax.random.PRNGKey(1), batch["inputs"])["params"])
  grad = jax.jit(jax.grad(objective.loss_fn, has_aux=True), static_argnums=(1,),
                 static_argnames=("train",))
  g_plain, s_plain = grad(params, plain_model, batch, None, train=False)
  g_tiled, s_tiled = grad(params, tiled_model, batch, None, train=False)
  assert set(s_plain) == set(s_tiled) >= {"loss_sum", "count", "correct", "near_correct"}
  for key in s_plain:
    np.testing.assert_allclose(s_tiled[key], s_plain[key], rtol=1e-5, atol=1e-5, err_msg=key)
  chex.assert_trees_all_close(g_tiled, g_plain, rtol=1e-4, atol=1e-6)
  # The plain path is optax's loss on the model's logits: the sums are those numbers.
  logits = plain_model.apply({"params": params}, batch["inputs"], batch["positions"],
                             batch["segment_ids"])
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
  np.testing.assert_allclose(s_tiled["loss_sum"], jnp.sum(ce * batch["loss_mask"]), rtol=1e-5)


def test_bfloat16_untied_head_is_reproduced():
  """The untied head computes in model.dtype: the tiled logits round the same way (the tied
  float32 head is the test above)."""
  model_cfg = ModelConfig(vocab_size=V, num_layers=1, d_model=16, num_heads=2, num_kv_heads=2,
                          head_dim=8, mlp_dim=32, tie_embeddings=False, dtype="bfloat16",
                          loss_token_tile=0)
  batch = {k: jnp.asarray(v) for k, v in _batch().items()}
  model = Transformer(model_cfg)
  params = nn.meta.unbox(model.init(jax.random.PRNGKey(2), batch["inputs"])["params"])
  _, plain = objective.loss_fn(params, model, batch, None, train=False)
  _, tiled = objective.loss_fn(params, Transformer(dataclasses.replace(model_cfg,
                                                                       loss_token_tile=8)),
                               batch, None, train=False)
  np.testing.assert_allclose(tiled["loss_sum"], plain["loss_sum"], rtol=1e-6)
  assert float(tiled["correct"]) == float(plain["correct"])


def test_auto_rule_and_bad_field():
  assert loss_tiles.token_tile(-1, 260, 4096) == 0  # 1.1M logits per row: the plain head
  assert loss_tiles.token_tile(-1, 151936, 4096) == loss_tiles.AUTO_TILE
  assert loss_tiles.token_tile(-1, 151936, 256) == 0  # 39M < 2**27
  assert loss_tiles.token_tile(64, 100, 32) == 32 and loss_tiles.token_tile(0, 10**6, 10**6) == 0
  with pytest.raises(ConfigError, match="model.loss_token_tile"):
    ModelConfig(loss_token_tile=-2).validate()
