"""Decoding after eviction: equals a forward pass with the evicted keys masked, keep-all equals
no eviction, the pruned cache holds only the kept entries, other kinds are refused (a tiny
Qwen3 checkpoint against transformers: test_eviction_qwen3.py)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from chunkformer import decode
from chunkformer.config import AttentionConfig, ConfigError, ModelConfig
from chunkformer.eviction import (
  H2O,
  ChunkKV,
  KNorm,
  SnapKV,
  label,
)
from chunkformer.model import Transformer
from tests.eviction_reference import keep_masks, masked_forward_jit

V, T, PROMPT, B = 32, 20, 14, 2
BUDGET = 8


def _model(pattern="kind=full"):
  return Transformer(ModelConfig(
      vocab_size=V, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8,
      mlp_dim=64, key_shift=2, layer_pattern=pattern,
      attention=AttentionConfig(kind="full", chunk_size=4, window=3)))


@pytest.fixture(scope="module")
def setup():
  model = _model()
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, V, (B, T)), jnp.int32)
  shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), tokens)["params"])
  rng = np.random.default_rng(0)
  params = jax.tree_util.tree_map(
      lambda s: jnp.asarray(rng.normal(size=s.shape) * 0.5, s.dtype), shapes)
  return model, params, tokens


def _decoded(model, params, tokens, policy):
  """Logits at positions PROMPT-1 .. T-1: the prefill's last, then one step per token."""
  logits, cache, kept = decode.prefill_kept(model, params, tokens[:, :PROMPT], T, policy)
  got = [logits[:, -1]]
  for t in range(PROMPT, T - 1):
    step_logits, cache = decode.step(model, params, cache, tokens[:, t:t + 1])
    got.append(step_logits)
  return jnp.stack(got, axis=1), logits, cache, kept


# per kv head from the last queries, from every query, per row with one selection for both
# layers (every policy's selection itself: test_eviction_policies.py; the pruning and decoding
# path is the same for all)
@pytest.mark.parametrize("policy", [
    SnapKV(BUDGET, window=2, kernel=3),
    H2O(BUDGET, recent=2),
    ChunkKV(BUDGET, window=2, chunk=3, kernel=3, layer_reuse=2),
], ids=label)
def test_decode_after_eviction_matches_forward_with_evicted_keys_masked(setup, policy):
  model, params, tokens = setup
  decoded, prompt_logits, cache, kept = _decoded(model, params, tokens, policy)
  kept = jnp.stack(kept)
  assert kept.shape == (2, B, 2, BUDGET)
  masks = keep_masks(kept, 4, PROMPT, T - 1)
  expected = masked_forward_jit(model, params, tokens[:, :T - 1], jnp.asarray(masks))
  np.testing.assert_allclose(prompt_logits, expected[:, :PROMPT], atol=1e-5, rtol=0)
  np.testing.assert_allclose(decoded, expected[:, PROMPT - 1:], atol=1e-5, rtol=0)
  # eviction changed what later queries read: the unmasked forward differs
  plain = jax.jit(model.apply)({"params": params}, tokens[:, :T - 1])
  assert np.abs(np.asarray(plain[:, PROMPT:] - expected[:, PROMPT:])).max() > 1e-3
  state = cache["block_0"]["attn"]["state"]
  assert int(state["index"]) == T - 1 and int(state["length"]) == BUDGET + T - 1 - PROMPT
  # the cache holds the kept entries and the room to decode, nothing more: the arrays of a
  # plain cache of that size plus one int32 slot count per layer
  assert state["k"].shape == (B, BUDGET + T - PROMPT, 2, 8)
  room = decode.init_cache(model.model, B, BUDGET + T - PROMPT)
  assert decode.cache_bytes(cache) == decode.cache_bytes(room) + 4 * 2
  assert decode.cache_bytes(cache) < decode.cache_bytes(decode.init_cache(model.model, B, T))
  if isinstance(policy, ChunkKV):
    np.testing.assert_array_equal(kept[0], kept[1])  # layer 1 reuses layer 0's selection
    np.testing.assert_array_equal(kept[:, :, 0], kept[:, :, 1])  # one selection per row


def test_keep_all_equals_no_eviction(setup):
  model, params, tokens = setup
  decoded, _, cache, kept = _decoded(model, params, tokens, SnapKV(1.0, window=2, kernel=3))
  np.testing.assert_array_equal(kept[0], np.broadcast_to(np.arange(PROMPT), (B, 2, PROMPT)))
  everything = np.ones((2, B, 4, T - 1, T - 1), bool)
  plain = masked_forward_jit(model, params, tokens[:, :T - 1], jnp.asarray(everything))
  np.testing.assert_allclose(decoded, plain[:, PROMPT - 1:], atol=1e-5, rtol=0)


def test_other_kinds_and_impossible_budgets_are_refused_before_the_forward_pass(setup):
  _, params, tokens = setup
  with pytest.raises(ConfigError, match=r"'model.layers\[1\].kind'.*'window'"):
    decode.prefill(_model("kind=full;kind=window"), params, tokens[:, :PROMPT], T,
                   eviction=KNorm(4))
  with pytest.raises(ConfigError, match="'eviction.knorm.budget': 16 tokens exceed the prompt"):
    decode.prefill(setup[0], params, tokens[:, :PROMPT], T, eviction=KNorm(16))
  with pytest.raises(ConfigError, match="give a policy"):
    decode.prefill(setup[0], params, tokens[:, :PROMPT], T, eviction="snapkv")
  with pytest.raises(ConfigError, match="give a policy"):
    decode.generate(setup[0], params, tokens[:, :PROMPT], 2, eviction=SnapKV)
