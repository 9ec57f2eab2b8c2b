"""Prefill attention time and memory of each sparse pattern against blockwise dense attention.

  python bench/sparse_prefill.py [--lengths 8192 16384 32768 65536] [--repeats 1]
                                 [--implementation xla|pallas_gpu|pallas_tpu]

One layer's prompt attention, forward only (a prefill): B = 1, 4 query heads of 64 over 2 kv
heads (GQA), float32, random q/k/v. The baseline is ``attention.blockwise`` (XLA online softmax
in 512-token blocks: the dense path that never forms T x T, the CPU default). Each pattern is
timed end to end as the prefill runs it: online index estimation from q and k, then
``kernels.block_sparse_attention`` with the chosen implementation (CPU: ``xla``). Columns:
- speedup = dense time / pattern time (process CPU seconds, all threads: steadier than wall on
  a shared machine; wall beside it), both measured in this run;
- useful = the useful-FLOP ratio: causal (query, key) pairs over the pairs the pattern's index
  set keeps (``sparse_prefill.kept_fraction``, averaged over heads), so speedup / useful is the
  share of the ideal saving realised (1.0: time proportional to the pairs kept);
- memory = XLA's compiled scratch (temp) bytes of the whole computation.
Random q/k/v make the pooled and last-query scores flat, so the estimated indices are arbitrary
choices within each budget; the time depends on the budget, not on what is chosen. Writes JSON +
markdown to bench/results/sparse_prefill_<backend>.{json,md} (command, date, machine, load).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import kernels  # noqa: E402
from chunkformer.attention import blockwise  # noqa: E402
from chunkformer.sparse_prefill import (  # noqa: E402
  AShape,
  BlockSparse,
  VerticalSlash,
  kept_fraction,
)

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 4, 2, 64, 64
PATTERNS = (BlockSparse(top=16), BlockSparse(top=64), AShape(sink=64, local=1024),
            AShape(sink=64, local=4096), VerticalSlash(vertical=256, slash=100),
            VerticalSlash(vertical=1000, slash=132))


def _time(fn, args, repeats: int) -> tuple[float, float]:
  """Median (wall, process CPU) seconds after one compiling call."""
  jax.block_until_ready(fn(*args))
  walls, cpus = [], []
  for _ in range(repeats):
    wall, cpu = time.perf_counter(), time.process_time()
    jax.block_until_ready(fn(*args))
    walls.append(time.perf_counter() - wall)
    cpus.append(time.process_time() - cpu)
  return float(np.median(walls)), float(np.median(cpus))


def _temp_bytes(fn, args) -> int:
  return int(fn.lower(*args).compile().memory_analysis().temp_size_in_bytes)


def _dense(q, k, v):
  return blockwise.blockwise_attention(q, k, v, jnp.zeros(q.shape[:2], jnp.int32))


def _sparse(pattern, implementation):
  def f(q, k, v):
    index = pattern.index(q, k, BLOCK)
    return kernels.block_sparse_attention(q, k, v, *index, block=BLOCK,
                                          implementation=implementation)
  return jax.jit(f)


def _row_text(r: dict) -> str:
  return (f"{r['seq_len']:>6} {r['pattern']:<34} {r['wall_s'] * 1e3:>9.0f} "
          f"{r['cpu_s'] * 1e3:>9.0f} {r.get('speedup_cpu', 1.0):>8.2f} "
          f"{r.get('speedup_wall', 1.0):>8.2f} {r['useful_ratio']:>7.2f} "
          f"{r.get('of_useful_cpu', 1.0):>8.2f} {r['temp_mb']:>8.0f} {r['load_average']:>5.1f}")


def _row_md(r: dict) -> str:
  cells = [str(r["seq_len"]), r["pattern"], f"{r['wall_s'] * 1e3:.0f}", f"{r['cpu_s'] * 1e3:.0f}",
           f"{r.get('speedup_cpu', 1.0):.2f}", f"{r.get('speedup_wall', 1.0):.2f}",
           f"{r['useful_ratio']:.2f}", f"{r.get('of_useful_cpu', 1.0):.2f}",
           f"{r['temp_mb']:.0f}", f"{r['load_average']:.1f}"]
  return "| " + " | ".join(cells) + " |"


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384, 32768, 65536])
  parser.add_argument("--repeats", type=int, default=1)
  parser.add_argument("--implementation", default="xla", choices=kernels.IMPLEMENTATIONS)
  parser.add_argument("--out", default=None, help="path stem (default bench/results/"
                      "sparse_prefill_<backend>)")
  args = parser.parse_args()
  out = args.out or os.path.join(ROOT, "bench", "results",
                                 f"sparse_prefill_{jax.default_backend()}")
  dense_fn = jax.jit(_dense)
  rows = []
  print(f"{'T':>6} {'pattern':<34} {'wall ms':>9} {'cpu ms':>9} {'x (cpu)':>8} {'x (wall)':>8} "
        f"{'useful':>7} {'of use':>8} {'temp MB':>8} {'load':>5}")
  for t in args.lengths:
    rng = np.random.default_rng(t)
    q = jnp.asarray(rng.normal(size=(1, t, HEADS, HEAD_DIM)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(1, t, KV_HEADS, HEAD_DIM)), jnp.float32)
            for _ in range(2))
    wall, cpu = _time(dense_fn, (q, k, v), args.repeats)
    base = dict(seq_len=t, pattern="dense (blockwise, 512)", wall_s=wall, cpu_s=cpu,
                useful_ratio=1.0, temp_mb=_temp_bytes(dense_fn, (q, k, v)) / 2**20,
                load_average=os.getloadavg()[0])
    rows.append(base)
    print(_row_text(base), flush=True)
    for pattern in PATTERNS:
      fn = _sparse(pattern, args.implementation)
      wall, cpu = _time(fn, (q, k, v), args.repeats)
      index = jax.jit(lambda q, k, p=pattern: p.index(q, k, BLOCK))(q, k)
      useful = 1.0 / float(jnp.mean(kept_fraction(index, t, BLOCK)))
      row = dict(seq_len=t, pattern=pattern.label(), wall_s=wall, cpu_s=cpu,
                 speedup_cpu=base["cpu_s"] / cpu, speedup_wall=base["wall_s"] / wall,
                 useful_ratio=useful, of_useful_cpu=base["cpu_s"] / cpu / useful,
                 temp_mb=_temp_bytes(fn, (q, k, v)) / 2**20, load_average=os.getloadavg()[0])
      rows.append(row)
      print(_row_text(row), flush=True)
  meta = dict(command="python " + " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
              date=datetime.datetime.now().isoformat(timespec="seconds"),
              backend=jax.default_backend(), devices=[str(d) for d in jax.devices()],
              cpu_count=os.cpu_count(), load_average_at_end=os.getloadavg()[0],
              jax=jax.__version__, python=platform.python_version(), batch=1, heads=HEADS,
              kv_heads=KV_HEADS, head_dim=HEAD_DIM, block=BLOCK, dtype="float32",
              implementation=args.implementation, repeats=args.repeats, timing="median")
  os.makedirs(os.path.dirname(out), exist_ok=True)
  with open(out + ".json", "w") as f:
    json.dump(dict(meta=meta, rows=rows), f, indent=1)
  with open(out + ".md", "w") as f:
    f.write(f"# Sparse prefill attention vs blockwise dense\n\n`{meta['command']}`  \n"
            f"{meta['date']}, {meta['backend']} ({args.implementation}), {meta['cpu_count']} "
            f"cores, float32, B=1, {HEADS} heads of {HEAD_DIM} over {KV_HEADS} kv heads, block "
            f"{BLOCK}; forward only, index estimation included; median of {args.repeats} after a "
            "compiling call. x = dense time / pattern time (CPU: process time of all threads); "
            "useful = causal pairs / kept pairs; 'of useful' = x (CPU) / useful; temp = XLA "
            "scratch; load = 1-minute load average when the row finished.\n\n"
            "| T | pattern | wall ms | CPU ms | x (CPU) | x (wall) | useful | of useful "
            "| temp MB | load |\n|---|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
      f.write(_row_md(r) + "\n")
  print(f"wrote {out}.json and {out}.md")


if __name__ == "__main__":
  main()
