"""Every Pallas kernel lowers for CUDA (Triton, and the Mosaic GPU forward) and TPU (Mosaic) at
the benchmark's tile sizes.

Lowering runs on CPU and catches block-shape, layout and unsupported-op errors long before a
GPU or TPU is at hand (it does not run the backend compilers: Triton's and Mosaic's own
passes happen on the device machine).
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest

import kernels
from tests import kernel_cases as kc

PLATFORMS = {"pallas_gpu": ("cuda", "__gpu$xla.gpu.triton"),
             "pallas_tpu": ("tpu", "tpu_custom_call")}


def _kernel_names(fn, *args, implementation):
  platform, target = PLATFORMS[implementation]
  text = jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()
  assert target in text
  names = re.findall(r'(?:kernel_)?name = "([\w.]+)"', text)
  names = {n for n in names if n.startswith(("chunk_attention", "segment_pool", "decode"))}
  if "@mosaic_gpu_v2" in text:  # a Mosaic GPU kernel: its name is inside the serialized module
    names |= {n for n in ("chunk_attention_fwd_mosaic",) if n in text}
  return names


@pytest.mark.parametrize("implementation,device_kind", [
    ("pallas_gpu", None), ("pallas_gpu", "NVIDIA H200"), ("pallas_gpu", "fused"),
    ("pallas_gpu", "mosaic"), ("pallas_tpu", None)])
def test_chunk_attention_lowers_forward_and_backward(implementation, device_kind):
  # Benchmark shapes in miniature: bf16, MQA, head dim 128, window 128, M = 4, default tiles
  # (and the per-device table's Hopper tiles).
  args, kw = kc.attention_case(0, b=1, t=512, h=4, kh=1, d=128, m=4, docs=2, window=128,
                               sink=True, dtype=jnp.bfloat16)
  if device_kind == "fused":  # the FlashAttention-2 backward: atomics, no dq kernel
    kw = dict(kw, block_sizes=kernels.AttentionBlockSizes(backward="fused"))
  elif device_kind == "mosaic":  # the Mosaic GPU forward (Hopper tiles), the Triton backward
    kw = dict(kw, block_sizes=dataclasses.replace(
        kernels.AttentionBlockSizes.gpu("NVIDIA H200"), forward="mosaic"))
  elif device_kind:
    kw = dict(kw, block_sizes=kernels.AttentionBlockSizes.gpu(device_kind))
  fwd = lambda *a: kernels.chunk_attention(*a, **kw, implementation=implementation)
  loss = lambda q, k, v, ek, ev: fwd(q, k, v, args[3], ek, ev, *args[6:]).astype(
      jnp.float32).sum()
  # The loss needs the forward output so that the forward kernel is kept in the lowered text.
  both = lambda q, k, v, ek, ev: jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4))(
      q, k, v, ek, ev)
  names = _kernel_names(both, *args[:3], *args[4:6], implementation=implementation)
  if implementation == "pallas_gpu":
    forward = "chunk_attention_fwd_mosaic" if device_kind == "mosaic" else "chunk_attention_fwd"
    # One dk/dv kernel over raw-key and entry columns alike.
    assert names == {forward, "chunk_attention_dkv"} | (
        {"chunk_attention_dq"} if device_kind != "fused" else set())
  else:
    assert names == {"chunk_attention_fwd_tpu", "chunk_attention_dq_tpu",
                     "chunk_attention_dkv_raw_tpu", "chunk_attention_dkv_entries_tpu"}


@pytest.mark.parametrize("implementation", ["pallas_gpu", "pallas_tpu"])
def test_segment_pool_lowers_forward_and_backward(implementation):
  t, n = 512, 256
  ends = (jnp.arange(t) % 4 == 3)[None]
  seg = jnp.zeros((1, t), jnp.int32)

  def loss(values, logits, slot_bias):
    out = kernels.segment_pool(values, logits, ends, seg, capacity=t // 4,
                               slot_bias_SxN=slot_bias, implementation=implementation)
    return out[0].astype(jnp.float32).sum()

  x = jnp.zeros((1, t, n), jnp.bfloat16)
  names = _kernel_names(jax.value_and_grad(loss, argnums=(0, 1, 2)), x, x,
                        jnp.zeros((4, n), jnp.float32), implementation=implementation)
  assert names == {"segment_pool_gpu" if implementation == "pallas_gpu" else "segment_pool_tpu"}


@pytest.mark.parametrize("implementation", ["pallas_gpu", "pallas_tpu"])
@pytest.mark.parametrize("per_head_entries", [False, True])
def test_decode_attention_lowers(implementation, per_head_entries):
  b, h, kh, d, w, c = 2, 8, 2, 128, 128, 4096
  z = lambda *s: jnp.zeros(s, jnp.bfloat16)
  visible = jnp.ones((b, c, kh), bool) if per_head_entries else None
  fn = lambda *a: kernels.decode_attention(*a, entry_visible_BxCxK=visible,
                                           implementation=implementation, num_splits=4)
  names = _kernel_names(fn, z(b, h, d), z(b, w, kh, d), z(b, w, kh, d), jnp.ones((b, w), bool),
                        z(b, c, kh, d), z(b, c, kh, d), jnp.full((b,), 1000, jnp.int32),
                        implementation=implementation)
  assert names == {"decode_attention_gpu" if implementation == "pallas_gpu"
                   else "decode_attention_tpu"}
