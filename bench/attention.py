"""Forward+backward time of one compressed attention layer against full causal attention.

  python bench/attention.py [--lengths 1024 4096 8192 16384] [--chunk_sizes 4 8] [--repeats 3]

B = 1, 4 heads of 64 (4 kv heads, shared-KV entries), window W = 128, float32. Two levels:
- core: the attention proper from given projections. Full: ``jax.nn.dot_product_attention``
  (XLA, causal: it computes the whole T x T square). Fixed: gated pooling of the compressor
  values into T/M entries, RMSNorm + RoPE, then blockwise window attention (query blocks of W
  against 2W keys) and attention to the T/M entries in one softmax. Gradients w.r.t. all inputs.
- layer: the whole attention kind (projections q/k/v/o, and the compressor's two projections
  for fixed), d_model 256; gradients w.r.t. parameters and input.
The ideal FLOP ratio is T / (T/M + W): keys per query of full vs compressed attention. Times
are wall and process-CPU seconds (median); when full attention's scratch memory would not fit,
one head is timed and scaled by the head count (marked in the output). Prints a table and
writes JSON + markdown under bench/results/ (command, date, machine, load).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from chunkformer.attention import AttentionContext  # noqa: E402
from chunkformer.attention.compressed_core import compressed_attention  # noqa: E402
from chunkformer.attention.fixed import FixedAttention  # noqa: E402
from chunkformer.attention.full import FullAttention  # noqa: E402
from chunkformer.compression import Compressor, fixed_chunks  # noqa: E402
from chunkformer.config import AttentionConfig, ModelConfig  # noqa: E402

HEADS, HEAD_DIM, WINDOW = 4, 64, 128


def _model(chunk_size: int) -> ModelConfig:
  return ModelConfig(d_model=HEADS * HEAD_DIM, num_heads=HEADS, num_kv_heads=HEADS,
                     head_dim=HEAD_DIM, attention=AttentionConfig(
                         kind="fixed", chunk_size=chunk_size, window=WINDOW))


def _time(fn, args, repeats: int) -> tuple[float, float]:
  """Median (wall, process CPU) seconds of fn(*args) after one compiling call.

  CPU time (all threads) is the steadier measure on a shared machine; wall time is reported
  beside it.
  """
  jax.block_until_ready(fn(*args))
  walls, cpus = [], []
  for _ in range(repeats):
    wall, cpu = time.perf_counter(), time.process_time()
    jax.block_until_ready(fn(*args))
    walls.append(time.perf_counter() - wall)
    cpus.append(time.process_time() - cpu)
  return float(np.median(walls)), float(np.median(cpus))


def _available_bytes() -> int:
  with open("/proc/meminfo") as f:
    for line in f:
      if line.startswith("MemAvailable:"):
        return int(line.split()[1]) * 1024
  return 0


def _fwd_bwd(f, num_args: int):
  """jit of the gradient of <f(args), cotangent> w.r.t. every argument."""
  def loss(*args):
    out = f(*args)
    return jnp.vdot(out, jnp.cos(jnp.arange(out.size, dtype=out.dtype)).reshape(out.shape))
  return jax.jit(jax.grad(loss, argnums=tuple(range(num_args))))


def _normal(rng, shape):
  return jnp.asarray(rng.normal(size=shape), jnp.float32)


def _full_core(q, k, v):
  return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")


def _layer_case(cls, t: int, chunk_size: int, rng):
  """(fwd+bwd function, args) of one attention module of kind ``cls`` on a row of t tokens."""
  model = _model(chunk_size)
  x = _normal(rng, (1, t, model.d_model))
  zeros = jnp.zeros((1, t), jnp.int32)
  ctx = AttentionContext(zeros, jnp.arange(t)[None], zeros)
  layer = cls(model, model.attention, 0)
  shapes = nn.meta.unbox(jax.eval_shape(layer.init, jax.random.key(0), x, ctx, {})["params"])
  params = jax.tree_util.tree_map(lambda s: _normal(rng, s.shape) * 0.1, shapes)

  def f(params, x):
    return layer.apply({"params": params}, x, ctx, {})[0]

  return _fwd_bwd(f, 2), (params, x)


@functools.cache
def full_times(level: str, t: int, repeats: int) -> tuple[tuple[float, float] | None, str]:
  """((wall, cpu) or None, how it was timed) of full attention; shared by every M."""
  rng = np.random.default_rng(t)
  if level == "core":
    fn, args = _fwd_bwd(_full_core, 3), tuple(_normal(rng, (1, t, HEADS, HEAD_DIM))
                                              for _ in range(3))
  else:
    fn, args = _layer_case(FullAttention, t, 4, rng)
  need = fn.lower(*args).compile().memory_analysis().temp_size_in_bytes
  if need <= 0.45 * _available_bytes():  # XLA scratch is not the whole footprint: be safe
    return _time(fn, args, repeats), "all heads"
  if level != "core":
    return None, f"skipped: needs {need / 1e9:.1f} GB"
  # Heads are independent and cost the same: time one and scale, rather than swap or OOM.
  wall, cpu = _time(fn, tuple(a[:, :, :1] for a in args), repeats)
  return (wall * HEADS, cpu * HEADS), f"1 head x {HEADS} (all heads need {need / 1e9:.1f} GB)"


def fixed_times(level: str, t: int, chunk_size: int, repeats: int) -> tuple[float, float]:
  """(wall, cpu) of the fixed compressed attention (see module docstring for the levels)."""
  rng = np.random.default_rng(t + chunk_size)
  if level == "layer":
    return _time(*_layer_case(FixedAttention, t, chunk_size, rng), repeats)
  model = _model(chunk_size)
  seg = jnp.zeros((1, t), jnp.int32)
  comp = Compressor(model, model.attention)
  chunks = fixed_chunks(t, chunk_size, None, 1, HEADS)
  x_shape = jax.ShapeDtypeStruct((1, t, HEADS * HEAD_DIM), jnp.float32)
  params = nn.meta.unbox(jax.eval_shape(comp.init, jax.random.key(0), x_shape)["params"])

  def pool(module, kv, z):
    slots = module.slot_buffer(kv, chunks), module.slot_buffer(z, chunks)
    pooled = module.pool_slots(*slots, chunks.window_valid_BxCxWxK)
    return module.finish(pooled, chunks.positions_BxCxK)

  def fixed(q, k, v, kv, z, ape, scale):
    entries = comp.apply({"params": {**params, "ape": ape, "norm": {"scale": scale}}}, kv, z,
                         method=pool)
    return compressed_attention(q, k, v, seg, window=WINDOW, entry_k_BxCxKxD=entries,
                                entry_ends_BxCxK=chunks.ends_BxCxK)

  args = tuple(_normal(rng, (1, t, HEADS, HEAD_DIM)) for _ in range(5)) + (
      _normal(rng, params["ape"].shape), jnp.ones(params["norm"]["scale"].shape))
  return _time(_fwd_bwd(fixed, 7), args, repeats)


def _format_row(r: dict, text: bool) -> str:
  """A console line (text) or a markdown table row; rows without a full timing say why."""
  def ms(key):
    return f"{r[key] * 1e3:.0f}" if key in r else "-"

  def ratio(key):
    return f"{r[key]:.2f}" if key in r else "-"

  cells = [r["level"], str(r["seq_len"]), str(r["chunk_size"]), ms("full_wall_s"),
           ms("fixed_wall_s"), ratio("speedup_wall"), ms("full_cpu_s"), ms("fixed_cpu_s"),
           ratio("speedup_cpu"), f"{r['ideal']:.2f}"]
  if text:
    widths = (6, 6, 3, 9, 9, 8, 9, 9, 8, 6)
    line = " ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(
        zip(cells, widths, strict=True)))
    line += f" {ratio('fraction_of_ideal_cpu'):>8}"
    return line + ("" if r["full_method"] == "all heads" else f"  full: {r['full_method']}")
  cells += [ratio("fraction_of_ideal_wall"), ratio("fraction_of_ideal_cpu"),
            f"{r['load_average']:.1f}", r["full_method"]]
  return "| " + " | ".join(cells) + " |"


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192, 16384])
  parser.add_argument("--chunk_sizes", type=int, nargs="+", default=[4, 8])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--levels", nargs="+", default=["core", "layer"])
  parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "attention"))
  args = parser.parse_args()
  rows = []
  print(f"{'level':6} {'T':>6} {'M':>3} {'full ms':>9} {'fixed ms':>9} {'speedup':>8} "
        f"{'full cpu':>9} {'fixed cpu':>9} {'speedup':>8} {'ideal':>6} {'of ideal':>8}")
  for level in args.levels:
    for t in args.lengths:
      for m in args.chunk_sizes:
        full, full_method = full_times(level, t, args.repeats)
        wall_fixed, cpu_fixed = fixed_times(level, t, m, args.repeats)
        ideal = t / (t / m + WINDOW)
        row = dict(level=level, seq_len=t, chunk_size=m, window=WINDOW, ideal=ideal,
                   fixed_wall_s=wall_fixed, fixed_cpu_s=cpu_fixed, full_method=full_method,
                   load_average=os.getloadavg()[0])
        if full is not None:
          (wall_full, cpu_full) = full
          row.update(full_wall_s=wall_full, full_cpu_s=cpu_full,
                     speedup_wall=wall_full / wall_fixed, speedup_cpu=cpu_full / cpu_fixed,
                     fraction_of_ideal_wall=wall_full / wall_fixed / ideal,
                     fraction_of_ideal_cpu=cpu_full / cpu_fixed / ideal)
        rows.append(row)
        print(_format_row(row, text=True), flush=True)
  meta = dict(command="python " + " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
              date=datetime.datetime.now().isoformat(timespec="seconds"),
              backend=jax.default_backend(), devices=[str(d) for d in jax.devices()],
              cpu_count=os.cpu_count(), load_average_at_end=os.getloadavg()[0],
              jax=jax.__version__, python=platform.python_version(), batch=1, heads=HEADS,
              head_dim=HEAD_DIM, dtype="float32", repeats=args.repeats, timing="median")
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out + ".json", "w") as f:
    json.dump(dict(meta=meta, rows=rows), f, indent=1)
  with open(args.out + ".md", "w") as f:
    f.write(f"# Attention forward+backward: fixed compression vs full\n\n`{meta['command']}`  \n"
            f"{meta['date']}, {meta['backend']}, {meta['cpu_count']} cores, float32, B=1, "
            f"{HEADS} heads of {HEAD_DIM}, W={WINDOW}; median of {args.repeats}. Speedup = "
            "full time / fixed time; 'of ideal' = speedup / (T / (T/M + W)). CPU = process "
            "time of all threads (steadier than wall time on a shared machine).\n\n"
            "| level | T | M | full ms | fixed ms | speedup (wall) | full CPU ms | fixed CPU ms "
            "| speedup (CPU) | ideal | of ideal (wall) | of ideal (CPU) | load | full timed as |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
      f.write(_format_row(r, text=False) + "\n")
  print(f"wrote {args.out}.json and {args.out}.md")


if __name__ == "__main__":
  main()
