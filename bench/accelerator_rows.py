"""The measurements of ``bench.accelerator``, one row each, run inside its worker processes.

Kernel rows: the compressed-attention kernel (``kernels.chunk_attention``, the platform's Pallas
kernel) against the platform's best full causal attention at Qwen3-0.6B's attention shape, with
the inputs, the useful-work count and the timer of ``bench.kernels``. Useful FLOPs count the
visible scores only (window + visible entries; the causal triangle), 4 x D x H per score
forward, 3.5x that forward + backward (backward about 2.5x forward), as in ``bench.kernels``.

Train rows: one compiled training step of ``configs/lm/qwen3_0p6b.py`` (per attention kind,
one row per device), timed, with model FLOPs (``chunkformer.flops``) and MFU, the compiled
plan's bytes (``memory_analysis``) and the measured peak (``device.memory_stats``).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
import os
import platform
import time
import types

import jax
import jax.numpy as jnp
import numpy as np

import kernels
from bench import kernels as kernel_bench

# Qwen3-0.6B's attention (configs/lm/qwen3_0p6b.py), and the tiny shape of --small.
SHAPES = {"paper": dict(heads=16, kv_heads=8, head_dim=128, window=128),
          "small": dict(heads=4, kv_heads=2, head_dim=32, window=16)}
DYNAMIC_MEAN = 4.0  # mean chunk length of the dynamic rows (the study's target M)


def pallas_implementation(backend: str) -> tuple[str, bool]:
  """(implementation, interpret) of the compressed kernels: the platform's Pallas kernel.

  Elsewhere (CPU) the GPU kernel in interpret mode: the same kernel code, not a speed.
  """
  if backend == "gpu":
    return "pallas_gpu", False
  if backend == "tpu":
    return "pallas_tpu", False
  return "pallas_gpu", True


def full_implementation(backend: str) -> str:
  """The platform's best full causal attention: cuDNN (GPU), splash (TPU), XLA otherwise."""
  return {"gpu": "cudnn", "tpu": "splash"}.get(backend, "xla")


def full_attention(name: str, t: int, heads: int, kv_heads: int, head_dim: int,
                   interpret: bool = False):
  """(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD) -> o: causal attention by ``name`` (GQA)."""
  if name in ("cudnn", "xla"):
    return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                        implementation=name)
  if name != "splash":
    raise ValueError(f"unknown full attention {name!r}")
  from jax.experimental.pallas.ops.tpu import splash_attention as splash

  g, block = heads // kv_heads, min(512, t)
  sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                            block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                            block_q_dq=block, block_kv_dq=block)
  mask = splash.MultiHeadMask([splash.CausalMask((t, t)) for _ in range(g)])
  # One MQA kernel per kv head: its G query heads share that head's keys and values.
  kernel = splash.make_splash_mqa_single_device(mask, block_sizes=sizes, interpret=interpret)

  def attend(q, k, v):
    b = q.shape[0]
    q_BxKxGxTxD = jnp.moveaxis(q.reshape(b, t, kv_heads, g, head_dim), 1, 3) * head_dim**-0.5
    k_BxKxTxD, v_BxKxTxD = (jnp.moveaxis(x, 1, 2) for x in (k, v))
    o = jax.vmap(jax.vmap(kernel))(q_BxKxGxTxD, k_BxKxTxD, v_BxKxTxD)
    return jnp.moveaxis(o, 3, 1).reshape(q.shape)

  return attend


def _timings(fn, inputs, reps, grad_argnums, trace_dir=None) -> dict[str, float]:
  loss = lambda *x: jnp.sum(fn(*x).astype(jnp.float32))
  fwd, fwd_bwd = jax.jit(fn), jax.jit(jax.value_and_grad(loss, argnums=grad_argnums))
  out = dict(fwd_ms=kernel_bench._timed(fwd, *inputs, reps=reps),
             fwd_bwd_ms=kernel_bench._timed(fwd_bwd, *inputs, reps=reps))
  if trace_dir is not None:  # one compiled call of each, under the profiler (already warm)
    with jax.profiler.trace(trace_dir):
      jax.block_until_ready(fwd(*inputs))
      jax.block_until_ready(fwd_bwd(*inputs))
    out["trace_dir"] = trace_dir
  return out


def tile_counts(t: int, entry_ends_C, window: int, implementation: str, group: int) -> dict:
  """Executed / needed tiles and pairs of each kernel of ``implementation`` on this layout."""
  from kernels import tiles as tiles_lib

  platform = "tpu" if implementation == "pallas_tpu" else "gpu"
  bs = (kernels.AttentionBlockSizes.gpu(jax.devices()[0].device_kind) if platform == "gpu"
        else kernels.AttentionBlockSizes.tpu())  # what chunk_attention picks on this device
  make = tiles_lib.gpu_tiles if platform == "gpu" else tiles_lib.tpu_tiles
  entry_ends_C = np.asarray(entry_ends_C)
  tiles = (make(bs, t, entry_ends_C.shape[0], group) if platform == "gpu"
           else make(bs, t, entry_ends_C.shape[0]))
  seg = np.zeros(t, np.int64)
  out = {}
  for kernel in (k for k in tiles_lib.KERNELS if k.startswith(platform)):
    n = tiles_lib.count(kernel, seg, entry_ends_C, window, tiles)
    out[kernel] = dict(executed=n.executed, needed=n.needed, tile_ratio=n.tile_ratio,
                       pair_ratio=n.pair_ratio)
  return out


def kernel_rows(t: int, chunk: str, shape: str, dtype, reps: int, full_impl: str | None = None,
                trace_dir: str | None = None):
  """Rows: the compressed kernel, full attention (the platform's best, and the project's
  kernel as the model runs it: a whole-row window, ``attention.dispatch.full_attention``), and
  their comparison at T and M = chunk; with ``trace_dir`` a profiler trace of each op."""
  from chunkformer.attention import dispatch
  backend = jax.default_backend()
  dims = SHAPES[shape]
  args = types.SimpleNamespace(batch=1, dynamic_mean=DYNAMIC_MEAN, **dims)
  rng = np.random.default_rng(0)
  ends, capacity, (q, k, v, ek, ev), (seg, entry_ends, entry_seg) = kernel_bench._attention_case(
      args, rng, t, chunk, dtype)
  visible, causal = kernel_bench._visible_pairs(ends[0], dims["window"])
  per_score = 4 * dims["head_dim"] * dims["heads"]
  impl, interpret = pallas_implementation(backend)
  full_impl = full_impl or full_implementation(backend)
  cases = {
      "compressed": (impl, visible, lambda q, k, v, ek, ev: kernels.chunk_attention(
          q, k, v, seg, ek, ev, entry_ends, entry_seg, window=dims["window"],
          implementation=impl, interpret=interpret), (q, k, v, ek, ev), (0, 1, 2, 3, 4)),
      "full": (full_impl, causal, full_attention(full_impl, t, dims["heads"], dims["kv_heads"],
                                                 dims["head_dim"], interpret=backend == "cpu"),
               (q, k, v), (0, 1, 2)),
      "full_kernel": (impl, causal, lambda q, k, v: dispatch.full_attention(
          q, k, v, seg, impl, interpret), (q, k, v), (0, 1, 2)),
  }
  if impl == "pallas_gpu" and chunk == "4":  # the FlashAttention-2 backward beside the split one
    fused = dataclasses.replace(kernels.AttentionBlockSizes.gpu(
        None if interpret else jax.devices()[0].device_kind), backward="fused")
    cases["compressed_fused_bwd"] = (impl, visible, lambda q, k, v, ek, ev: kernels.chunk_attention(
        q, k, v, seg, ek, ev, entry_ends, entry_seg, window=dims["window"], implementation=impl,
        interpret=interpret, block_sizes=fused), (q, k, v, ek, ev), (0, 1, 2, 3, 4))
    if jnp.dtype(dtype) != jnp.float32:  # the Mosaic GPU forward (wgmma: bf16 / f16 only)
      mosaic = dataclasses.replace(fused, backward="split", forward="mosaic")
      cases["compressed_mosaic_fwd"] = (impl, visible, lambda q, k, v, ek, ev: (
          kernels.chunk_attention(q, k, v, seg, ek, ev, entry_ends, entry_seg,
                                  window=dims["window"], implementation=impl,
                                  interpret=interpret, block_sizes=mosaic)),
          (q, k, v, ek, ev), (0, 1, 2, 3, 4))
  base = dict(section="kernels", T=t, M=chunk, dtype=jnp.dtype(dtype).name, capacity=capacity,
              **dims)
  rows = {}
  for name, (implementation, pairs, fn, inputs, argnums) in cases.items():
    row = dict(base, op=name, impl=implementation, interpret=interpret and name != "full",
               useful_fwd_flops=per_score * pairs)
    if name == "compressed":
      row["tiles"] = tile_counts(t, entry_ends[0], dims["window"], implementation,
                                 dims["heads"] // dims["kv_heads"])
    elif name == "full_kernel":
      row["tiles"] = tile_counts(t, np.full(1, kernels.PAD_END), t, implementation,
                                 dims["heads"] // dims["kv_heads"])
    try:
      row.update(_timings(fn, inputs, reps, argnums, trace_dir and os.path.join(
          trace_dir, f"T{t}_M{chunk}_{name}")))
      row["fwd_tflops"] = row["useful_fwd_flops"] / row["fwd_ms"] / 1e9
      row["fwd_bwd_tflops"] = 3.5 * row["useful_fwd_flops"] / row["fwd_bwd_ms"] / 1e9
      row["status"] = "ok"
    except Exception as e:  # noqa: BLE001 -- a failing row is a result; the others go on
      row["status"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
    rows[name] = row
  c, f, fk = rows["compressed"], rows["full"], rows["full_kernel"]
  stride = DYNAMIC_MEAN if chunk == "dynamic" else float(chunk)
  cmp = dict(base, op="speedup", useful_flop_ratio=causal / visible,
             formula_ratio=t / (t / stride + dims["window"]))  # T / (T/S + W)
  if c["status"] == f["status"] == "ok":
    cmp.update(fwd_speedup=f["fwd_ms"] / c["fwd_ms"],
               fwd_bwd_speedup=f["fwd_bwd_ms"] / c["fwd_bwd_ms"], status="ok")
  else:
    cmp["status"] = "failed: a timed row failed"
  if f["status"] == fk["status"] == "ok":  # the project's kernel as causal attention
    cmp.update(kernel_full_fwd_vs_best=f["fwd_ms"] / fk["fwd_ms"],
               kernel_full_fwd_bwd_vs_best=f["fwd_bwd_ms"] / fk["fwd_bwd_ms"])
  return [*rows.values(), cmp]


def _step_impl(c, backend: str) -> str:
  """Sets each kind's fastest attention on this platform in its config; returns its name.

  Kind full: what ``implementation: auto`` picks (the Pallas kernel over whole rows on GPU,
  splash on TPU, blockwise elsewhere): the config's default, ``xla``, builds T x T scores, which
  at 32K neither fits nor is the baseline a reader compares with. The compressed kinds: the
  platform's Pallas kernel where the config validates with it, else their XLA path.
  """
  from chunkformer import config as config_lib
  from chunkformer.attention import dispatch

  if c.model.attention.kind == "full":
    c.model.attention.implementation = dispatch.choose(
        config_lib.from_dict(c.to_dict()).model.attention, c.model.num_kv_heads, backend)
    return c.model.attention.implementation
  impl, _ = pallas_implementation(backend)
  if backend not in ("gpu", "tpu"):
    return c.model.attention.implementation
  trial = c.to_dict()
  trial["model"]["attention"]["implementation"] = impl
  try:
    config_lib.from_dict(trial)
  except Exception:  # noqa: BLE001 -- e.g. a layer pattern the kernels do not serve: XLA path
    return c.model.attention.implementation
  c.model.attention.implementation = impl
  return impl


def train_row(kind: str, t: int, small: bool, steps: int, rows_per_device: int = 1) -> dict:
  """One compiled, timed training step of the study's model (``rows_per_device`` rows of T
  tokens on each device, one micro-batch)."""
  from chunkformer import config as config_lib
  from chunkformer import flops, trainer
  from chunkformer import runtime as runtime_lib
  from configs.lm import qwen3_0p6b, qwen3_tiny

  backend = jax.default_backend()
  c = (qwen3_tiny if small else qwen3_0p6b).get_config(kind)
  if small:
    c.model.num_layers = 2  # v4's layer pattern repeats every 2 layers
  c.data.seq_len = t
  c.data.batch_size = jax.device_count() * rows_per_device
  c.train.grad_accum_steps = 1
  row = dict(section="train", op="train_step", kind=kind, T=t, config="qwen3_tiny (2 layers)"
             if small else "qwen3_0p6b", rows=c.data.batch_size, rows_per_device=rows_per_device,
             devices=jax.device_count(),
             implementation=_step_impl(c, backend))
  try:
    config = config_lib.from_dict(c.to_dict())
    rt = runtime_lib.build(config)
    state = rt.init_state()
    step = trainer.make_train_step(rt)
    with rt.context():
      batch = rt.batch("train", 0)
      began = time.perf_counter()
      compiled = step.lower(state, batch).compile()
      row["compile_s"] = time.perf_counter() - began
      mem = compiled.memory_analysis()
      row["plan_bytes"] = int(mem.argument_size_in_bytes + mem.output_size_in_bytes
                              - mem.alias_size_in_bytes + mem.temp_size_in_bytes)
      row["plan_temp_bytes"] = int(mem.temp_size_in_bytes)
      state, sums, _ = compiled(state, batch)  # warm-up
      jax.block_until_ready(sums)
      began = time.perf_counter()
      for _ in range(steps):
        state, sums, _ = compiled(state, batch)
      jax.block_until_ready(sums)
      row["step_s"] = (time.perf_counter() - began) / steps
    row["loss"] = float(sums["loss_sum"] / max(float(sums["count"]), 1.0))
    tokens = config.data.batch_size * t
    row["tokens_per_s"] = tokens / row["step_s"]
    row["model_flops_per_token"] = flops.train_flops_per_token(config.model, t)
    peak, source = flops.peak_flops_per_device(jax.devices()[0], config.train.peak_tflops)
    row["peak_flops_per_device"], row["peak_source"] = peak, source
    row["mfu"] = flops.mfu(row["model_flops_per_token"], row["tokens_per_s"], peak,
                           jax.device_count())
    row["measured_peak_bytes"] = measured_peak_bytes()
    row["status"] = "ok"
  except Exception as e:  # noqa: BLE001 -- e.g. out of memory: recorded, the next row runs
    row["status"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
  return row


def measured_peak_bytes() -> int | None:
  """Largest ``peak_bytes_in_use`` over this process's devices (None where not reported)."""
  peaks = []
  for d in jax.local_devices():
    stats = d.memory_stats() if hasattr(d, "memory_stats") else None
    if stats and "peak_bytes_in_use" in stats:
      peaks.append(int(stats["peak_bytes_in_use"]))
  return max(peaks) if peaks else None


PACKAGES = ("jaxlib", "flax", "optax", "orbax-checkpoint", "numpy")  # versions the rows record


def device_row() -> dict:
  d = jax.devices()[0]
  versions = {}
  for name in PACKAGES:
    try:
      versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      versions[name] = None
  return dict(section="device", op="device", backend=jax.default_backend(),
              device_kind=d.device_kind, devices=jax.device_count(), jax_version=jax.__version__,
              python=platform.python_version(), packages=versions, status="ok")


def finite(x) -> bool:
  return isinstance(x, (int, float)) and math.isfinite(x)
