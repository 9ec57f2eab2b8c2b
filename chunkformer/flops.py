"""Analytic model FLOPs per token and model FLOPs utilisation (MFU).

Model FLOPs count the work the model needs, not what an implementation spends: matmuls at 2
FLOPs per multiply-add, a training step at 3x the forward pass (backward = 2x forward),
rematerialisation not counted. Attention is counted for what each kind attends to, averaged
over the T query positions of a row: ``full`` t + 1 keys (causal, not T^2), ``window``
min(W, t + 1), ``fixed``/``dynamic`` the window plus the entries visible at t (about t / M;
``dynamic`` at its target mean length M; at most top-k with an indexer). The compressor
(projections, gates, pooling), the router, the indexer, the MLP and the output head are
counted; norms, RoPE and softmax elementwise work are not (a few percent at most).

MFU = model FLOPs per token x tokens per second / (peak FLOP/s per device x devices), with
the peak from ``PEAK_TFLOPS`` (dense bf16 of the device kind), ``train.peak_tflops`` if set,
or on CPU a measured float32 matmul rate of this process (``measured_cpu_peak``).
"""

from __future__ import annotations

import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from chunkformer.config import AttentionConfig, ModelConfig

# Dense bf16 peak per chip (TFLOP/s), matched against ``jax.Device.device_kind`` by substring,
# most specific first. GPU numbers are the SXM parts' dense (no sparsity) tensor-core peaks.
PEAK_TFLOPS = (
    ("H200", 989.0),
    ("H100", 989.0),
    ("A100", 312.0),
    ("TPU v5 lite", 197.0),  # v5e
    ("TPU v5e", 197.0),
    ("TPU v5p", 459.0),
    ("TPU v5", 459.0),  # v5p reports "TPU v5"
    ("TPU v6 lite", 918.0),  # v6e
    ("TPU v4", 275.0),
)


def _mean_keys(seq_len: int, attn: AttentionConfig) -> float:
  """Keys and entries a query attends to, averaged over positions t = 0..T-1."""
  t = np.arange(seq_len)
  if attn.kind == "full":
    return float(np.mean(t + 1))
  window = np.minimum(attn.window, t + 1)
  if attn.tail:  # the open chunk's tokens only
    window = t % attn.chunk_size + 1
  if attn.kind == "window":
    return float(np.mean(window))
  entries = (t + 1) // attn.chunk_size  # chunks closed by t
  if attn.topk:
    entries = np.minimum(entries, attn.topk)
  return float(np.mean(window + entries))


def _compressor_flops(m: ModelConfig, a: AttentionConfig, seq_len: int) -> float:
  """Forward FLOPs per token of one layer's compressor streams (and router / indexer)."""
  if a.kind not in ("fixed", "dynamic"):
    return 0.0
  k, d = m.num_kv_heads, m.head_dim
  groups = a.map_groups if a.kind == "fixed" else 1  # payload/gate maps (G)
  windows = a.window_tokens / a.chunk_size if a.kind == "fixed" else 1  # W/S entries per token
  r = d * groups
  per_stream = 2 * m.d_model * k * r  # wkv
  if a.pooling in ("gated", "gated_no_bias"):
    per_stream += 2 * m.d_model * k * groups * (d if a.gate == "vector" else 1)  # wgate
  per_stream += 2 * k * r * windows  # weighted sum over slots, per token
  if a.pooling == "mlp":
    block = a.chunk_size * windows * d
    per_stream += 2 * k * (block * block + block * d) / a.chunk_size
  if m.key_shift:
    per_stream += 2 * (m.key_shift - 1) * m.d_model * k * r
  flops = per_stream * (1 if a.shared_kv else 2)
  if a.topk:
    flops += 2 * m.d_model * k * d  # indexer queries
    visible = (np.arange(seq_len) + 1) // a.chunk_size
    flops += 2 * k * d * float(np.mean(visible))  # index scores over every visible entry
  return flops


def layer_forward_flops(m: ModelConfig, layer: int, seq_len: int) -> dict[str, float]:
  """Forward FLOPs per token of one layer, by part."""
  a = m.layer_attention(layer)
  e, h, kh, d = m.d_model, m.num_heads, m.num_kv_heads, m.head_dim
  proj = 2 * e * (h + 2 * kh) * d + 2 * h * d * e
  if m.key_shift:
    proj += 2 * (m.key_shift - 1) * e * d * (kh * (2 if m.value_shift else 1)
                                             + (h if m.query_shift else 0))
  parts = {"projections": float(proj),
           "attention": 4.0 * h * d * _mean_keys(seq_len, a),
           "compressor": _compressor_flops(m, a, seq_len),
           "mlp": 6.0 * e * m.mlp_dim}
  if a.kind == "dynamic" and a.boundary == "router" and _owns_router(m, layer):
    parts["compressor"] += 4.0 * e * e  # router queries and keys
  return parts


def _owns_router(m: ModelConfig, layer: int) -> bool:
  from chunkformer.attention.dynamic import owns_boundaries  # lazy: heavy import

  return owns_boundaries(m, layer)


def forward_flops_per_token(m: ModelConfig, seq_len: int) -> dict[str, float]:
  """Forward FLOPs per token of the whole model, by part (+ 'total')."""
  parts: dict[str, float] = {"head": 2.0 * m.d_model * m.vocab_size}
  for layer in range(m.num_layers):
    for name, value in layer_forward_flops(m, layer, seq_len).items():
      parts[name] = parts.get(name, 0.0) + value
  parts["total"] = sum(parts.values())
  return parts


def train_flops_per_token(m: ModelConfig, seq_len: int) -> float:
  """Model FLOPs of one training token: forward + backward (3x forward)."""
  return 3.0 * forward_flops_per_token(m, seq_len)["total"]


@functools.cache
def _square_matmul(size: int):
  """(a, compiled a @ a) on the first CPU device, compiled ahead of time.

  A compiled executable runs inside the trainer's multi-device mesh context, where a jitted
  single-device call would be refused; the first call must come from outside that context.
  """
  a = jax.device_put(jnp.ones((size, size), jnp.float32), jax.devices("cpu")[0])
  return a, jax.jit(lambda x: x @ x).lower(a).compile()


def measured_cpu_peak(size: int = 512, repeats: int = 5) -> float:
  """FLOP/s of an XLA float32 square matmul on this process's CPU (best of ``repeats``).

  Measured anew at each call (milliseconds): on shared cores the attainable rate moves with
  the load, and MFU is only meaningful against the rate of the same moment.
  """
  a, matmul = _square_matmul(size)
  matmul(a).block_until_ready()
  best = np.inf
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(a).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2.0 * size**3 / best


def peak_flops_per_device(device: jax.Device, configured_tflops: float = 0.0) -> tuple[float, str]:
  """(peak FLOP/s of one device, where the number comes from)."""
  if configured_tflops > 0:
    return configured_tflops * 1e12, "train.peak_tflops"
  kind = getattr(device, "device_kind", "")
  for name, tflops in PEAK_TFLOPS:
    if name.lower() in kind.lower():
      return tflops * 1e12, f"bf16 peak of {name}"
  if device.platform == "cpu":
    # Fake CPU devices share the process's cores: the measured rate is the whole machine's.
    return measured_cpu_peak() / max(len(jax.devices("cpu")), 1), "measured CPU float32 matmul"
  # Training must not stop for a missing table entry: MFU is then reported as NaN.
  return math.nan, f"unknown for device kind {kind!r}: set train.peak_tflops"


def mfu(flops_per_token: float, tokens_per_sec: float, peak_per_device: float,
        num_devices: int) -> float:
  return flops_per_token * tokens_per_sec / (peak_per_device * num_devices)
