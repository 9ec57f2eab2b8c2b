"""Full attention without a T x T matrix: every implementation equals today's dense path.

The reference is ``jax.nn.dot_product_attention(implementation="xla")`` with the dense
document-causal mask (implementation 'xla', what every committed full-attention run used).
Rows hold several documents, H = 4 query heads share K = 2 kv heads (GQA), T is not a
multiple of the block. The Pallas kernels (the project's and JAX's splash) run in interpret
mode on CPU.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from chunkformer import objective
from chunkformer.attention import blockwise
from chunkformer.attention import dispatch as impl_lib
from chunkformer.attention.dispatch import full_attention
from chunkformer.config import AttentionConfig, ConfigError, ModelConfig
from chunkformer.model import Transformer

B, T, H, K, D = 2, 37, 4, 2, 8
SEGMENTS = np.array([[0] * 10 + [1] * 20 + [2] * 7, [5] * 37], np.int32)


def _inputs():
  kq, kk, kv, kc = jax.random.split(jax.random.PRNGKey(0), 4)
  return (jax.random.normal(kq, (B, T, H, D)), jax.random.normal(kk, (B, T, K, D)),
          jax.random.normal(kv, (B, T, K, D)), jax.random.normal(kc, (B, T, H, D)))


def _value_and_grads(fn, q, k, v, cotangent):
  def loss(q, k, v):
    o = fn(q, k, v)
    return jnp.sum(o * cotangent), o
  (_, o), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return o, grads


def _dense(q, k, v):
  return full_attention(q, k, v, jnp.asarray(SEGMENTS), "xla")


def _check_equal(fn, tol):
  q, k, v, ct = _inputs()
  o_ref, g_ref = _value_and_grads(_dense, q, k, v, ct)
  o, g = _value_and_grads(fn, q, k, v, ct)
  np.testing.assert_allclose(o, o_ref, atol=tol, rtol=tol)
  for name, a, b in zip("qkv", g, g_ref, strict=True):
    np.testing.assert_allclose(a, b, atol=tol, rtol=tol, err_msg=f"d{name}")


def test_dense_reference_is_document_causal():
  """The reference itself: query t's output is the softmax-average of its document's values."""
  q, k, v, _ = _inputs()
  o = jax.jit(_dense)(q, k, v)
  t, h = 15, 3  # document 1 starts at 10; head 3 reads kv head 1
  s = np.arange(10, t + 1)
  logits = np.einsum("d,sd->s", q[0, t, h], k[0, s, 1]) / np.sqrt(D)
  w = np.exp(logits - logits.max())
  np.testing.assert_allclose(o[0, t, h], (w / w.sum()) @ np.asarray(v[0, s, 1]), atol=1e-5)


@pytest.mark.parametrize("block", [8, 64])  # several blocks with a padded tail | one block
def test_blockwise_equals_dense_values_and_gradients(block):
  seg = jnp.asarray(SEGMENTS)
  _check_equal(lambda q, k, v: blockwise.blockwise_attention(q, k, v, seg, block=block), 1e-5)


@pytest.mark.parametrize("implementation", ["pallas_gpu", "pallas_tpu", "splash"])
def test_pallas_kernels_serve_full_attention(implementation):
  seg = jnp.asarray(SEGMENTS)
  _check_equal(lambda q, k, v: full_attention(q, k, v, seg, implementation, interpret=True),
               2e-5)


def test_auto_picks_per_platform_and_config_checks():
  full = AttentionConfig(kind="full", implementation="auto")
  fixed = AttentionConfig(kind="fixed", window=8, implementation="auto")
  assert [impl_lib.choose(full, 2, p) for p in ("cpu", "gpu", "tpu")] == [
      "blockwise", "pallas_gpu", "splash"]
  assert [impl_lib.choose(fixed, 2, p) for p in ("cpu", "gpu", "tpu")] == [
      "xla", "pallas_gpu", "pallas_tpu"]
  # Options only the XLA path serves keep 'xla' under auto.
  topk = AttentionConfig(kind="fixed", window=8, topk=2, implementation="auto")
  assert impl_lib.choose(topk, 2, "gpu") == "xla"
  window = AttentionConfig(kind="window", window=8, implementation="auto")
  assert impl_lib.choose(window, 2, "tpu") == "xla"
  resolved = impl_lib.resolve(full, 2, platform="cpu")
  assert resolved.implementation == "blockwise" and resolved.kind == "full"
  assert impl_lib.resolve(AttentionConfig(), 2) == AttentionConfig()  # concrete: unchanged
  ModelConfig(attention=full).validate()
  ModelConfig(attention=AttentionConfig(kind="full", implementation="pallas_gpu")).validate()
  with pytest.raises(ConfigError, match="attention.*implementation"):
    ModelConfig(attention=AttentionConfig(kind="fixed", implementation="blockwise")).validate()


def test_compiled_training_step_of_full_attention_holds_no_t_by_t_scores():
  """T = 8192 (compile only): the gradient step's temporaries stay far below one layer's
  T x T x H float32 scores (1 GiB here; the dense path compiles to about 4 GiB)."""
  t, heads = 8192, 4
  model_cfg = ModelConfig(vocab_size=64, num_layers=1, d_model=32, num_heads=heads,
                          num_kv_heads=2, head_dim=8, mlp_dim=64,
                          attention=AttentionConfig(kind="full", implementation="auto"))
  model = Transformer(model_cfg)
  params = jax.eval_shape(lambda: nn.meta.unbox(
      model.init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"]))
  ids = jax.ShapeDtypeStruct((1, t), jnp.int32)
  batch = dict(inputs=ids, targets=ids, positions=ids, segment_ids=ids,
               loss_mask=jax.ShapeDtypeStruct((1, t), jnp.float32))
  step = jax.jit(lambda p, b: jax.grad(objective.loss_fn, has_aux=True)(p, model, b, None,
                                                                        train=False))
  temp = step.lower(params, batch).compile().memory_analysis().temp_size_in_bytes
  assert 0 < temp < t * t * heads * 4 / 16, temp


@pytest.mark.parametrize("implementation,platform,target", [
    ("pallas_gpu", "cuda", "__gpu$xla.gpu.triton"), ("splash", "tpu", "tpu_custom_call")])
def test_accelerator_paths_lower_forward_and_backward(implementation, platform, target):
  """Lowered (not compiled) for the accelerator from CPU: bf16, head dim 128, GQA, documents."""
  q = jnp.zeros((1, 512, 4, 128), jnp.bfloat16)
  kv = jnp.zeros((1, 512, 2, 128), jnp.bfloat16)
  seg = jnp.repeat(jnp.arange(2, dtype=jnp.int32), 256)[None]

  def loss(q, k, v):
    return full_attention(q, k, v, seg, implementation).astype(jnp.float32).sum()

  text = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).trace(q, kv, kv).lower(
      lowering_platforms=(platform,)).as_text()
  assert text.count(target) >= 2  # the forward kernel and at least one backward kernel
