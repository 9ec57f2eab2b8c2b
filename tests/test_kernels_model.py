"""Model level: training through the Pallas kernels (interpret mode) follows the XLA path."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from chunkformer import decode, objective
from chunkformer.config import AttentionConfig, ModelConfig
from chunkformer.model import Transformer

T, VOCAB, STEPS = 24, 32, 20



def _batch():
  tokens = jax.random.randint(jax.random.key(3), (2, T + 1), 0, VOCAB)
  segment_ids = jnp.asarray([[0] * 13 + [1] * 11, [0] * T])  # two documents in the first row
  starts = jnp.argmax(segment_ids[:, :, None] == segment_ids[:, None, :], axis=2)
  return dict(inputs=tokens[:, :-1], targets=tokens[:, 1:], segment_ids=segment_ids,
              positions=jnp.arange(T)[None] - starts, loss_mask=jnp.ones((2, T), jnp.float32))


def _losses(implementation, kind, boundary, layout="qwen3"):
  # The fixed kind with overlap (DeepSeek CSA): entries of 2M tokens, one end per entry.
  options = (dict(boundary=boundary, min_chunk=1, max_chunk=8) if kind == "dynamic"
             else dict(overlap=True))
  if layout == "deepseek_v4":  # K = V raw tokens and values rotated back after attention
    options.update(layout=layout, query_rank=16, output_groups=2, output_rank=8)
  attn = AttentionConfig(kind=kind, chunk_size=4, window=3, sink=True,
                         implementation=implementation, interpret=implementation != "xla",
                         **options)
  model = Transformer(ModelConfig(vocab_size=VOCAB, num_layers=1, d_model=32, num_heads=4,
                                  num_kv_heads=2, head_dim=8, mlp_dim=64, attention=attn))
  batch = _batch()
  params = model.init(jax.random.key(0), batch["inputs"])["params"]
  tx = optax.adam(3e-3)

  def step(carry, _):
    params, opt_state = carry
    grads, sums = jax.grad(lambda p: objective.loss_fn(p, model, batch, None), has_aux=True)(
        params)
    updates, opt_state = tx.update(grads, opt_state, params)
    loss = sums["loss_sum"] / sums["count"] + sums["aux/loss"]
    return (optax.apply_updates(params, updates), opt_state), loss

  run = jax.jit(lambda p: jax.lax.scan(step, (p, tx.init(p)), None, length=STEPS)[1])
  return np.asarray(run(params))


@pytest.mark.parametrize("kind,boundary,layout",
                         [("dynamic", "fixed", "qwen3"), ("dynamic", "router", "qwen3"),
                          ("fixed", "", "qwen3"), ("fixed", "", "deepseek_v4")])
def test_training_through_pallas_gpu_kernels_gives_the_xla_losses(kind, boundary, layout):
  want = _losses("xla", kind, boundary, layout)
  got = _losses("pallas_gpu", kind, boundary, layout)
  assert want[-1] < want[0]  # the run trains, so the comparison is not between constants
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_fixed_decoding_through_pallas_gpu_decode_kernel_gives_the_xla_forward_logits():
  # Every step attends through kernels.decode_attention (interpret mode), from an empty cache.
  def model(implementation):
    attn = AttentionConfig(kind="fixed", chunk_size=4, window=3, sink=True, overlap=True,
                           implementation=implementation, interpret=implementation != "xla")
    return Transformer(ModelConfig(vocab_size=VOCAB, num_layers=1, d_model=32, num_heads=4,
                                   num_kv_heads=2, head_dim=8, mlp_dim=64, attention=attn))

  tokens = _batch()["inputs"][:, :12]
  params = model("xla").init(jax.random.key(0), tokens)["params"]
  want = jax.jit(model("xla").apply)({"params": params}, tokens)
  net = model("pallas_gpu")
  cache, got = decode.init_cache(net.model, tokens.shape[0], tokens.shape[1]), []
  for i in range(tokens.shape[1]):
    step_logits, cache = decode.step(net, params, cache, tokens[:, i:i + 1])
    got.append(step_logits[:, None])
  np.testing.assert_allclose(jnp.concatenate(got, axis=1), want, atol=1e-5, rtol=1e-5)
