"""Kernel benchmark: chunk attention and segment pooling, every implementation, one JSON record.

Times forward and forward+backward of ``kernels.chunk_attention`` for each implementation
available on the machine against the XLA reference and against full causal attention
(``jax.nn.dot_product_attention``, cuDNN on GPU), over T, M (fixed 4, 8 and dynamic ends) and
dtype, and prints achieved TFLOP/s counting only *visible* score entries (useful work: raw keys
in the window plus visible entries for chunk attention, the causal triangle for full attention).
``segment_pool`` forward and forward+backward times are reported alongside. Each kernel output
is also compared with the XLA reference where that fits in memory.

  python -m bench.kernels                  # on a GPU/TPU: T in {4096, 16384, 65536}
  python -m bench.kernels --small          # CPU smoke test: tiny T, Pallas in interpret mode

On CPU the Pallas numbers come from interpret mode: a correctness record, not a speed.
Results go to bench/results/<date>_<device>.json (date and device also inside the record).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import pathlib
import statistics
import sys
import time

if __package__ in (None, ""):  # run as a file: bench/ must not shadow the top-level kernels
  sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import kernels  # noqa: E402

_DTYPES = {"bf16": jnp.bfloat16, "fp32": jnp.float32}


def _parse():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--small", action="store_true", help="tiny shapes for a CPU smoke test")
  p.add_argument("--seq", type=int, nargs="*", help="T values (default 4096 16384 65536)")
  p.add_argument("--chunks", nargs="*", default=["4", "8", "dynamic"], help="M values")
  p.add_argument("--dtypes", nargs="*", default=["bf16", "fp32"], choices=sorted(_DTYPES))
  p.add_argument("--batch", type=int, default=1)
  p.add_argument("--heads", type=int, default=16)
  p.add_argument("--kv_heads", type=int, default=1)
  p.add_argument("--head_dim", type=int, default=128)
  p.add_argument("--window", type=int, default=128)
  p.add_argument("--dynamic_mean", type=float, default=4.0, help="mean dynamic chunk length")
  p.add_argument("--reps", type=int, default=5)
  p.add_argument("--xla_limit_gb", type=float, default=40.0,
                 help="skip dense XLA baselines whose score tensors exceed this")
  p.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results"))
  args = p.parse_args()
  if args.seq is None:
    args.seq = [256] if args.small else [4096, 16384, 65536]
  if args.small:
    args.heads, args.head_dim, args.window, args.reps = 4, 32, 16, 2
    args.kv_heads = min(args.kv_heads, args.heads)
  return args


MIN_SAMPLE_S = 0.01  # a timed sample runs at least this long (calls back to back)


def _timed(fn, *args, reps, min_sample_s: float = MIN_SAMPLE_S):
  """Median wall time (ms) per call of a compiled function, after a warm-up call that compiles.

  Each of the ``reps`` samples runs the call n times back to back and waits once, n chosen
  from the warm-up so a sample lasts at least ``min_sample_s``: sub-millisecond GPU calls are
  otherwise dominated by host dispatch and its jitter (single calls at T = 4096 on an H200
  moved by up to 40% between runs). Slow calls (CPU, interpret mode) keep n = 1.
  """
  jax.block_until_ready(fn(*args))  # compiles
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  once = time.perf_counter() - start
  n = max(1, math.ceil(min_sample_s / max(once, 1e-9)))
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    out = None
    for _ in range(n):
      out = fn(*args)
    jax.block_until_ready(out)
    times.append((time.perf_counter() - start) / n)
  return 1e3 * statistics.median(times)


def _layout(rng, t, chunk, mean):
  """End flags for one document per row: every M-th token, or Bernoulli(1/mean) ends."""
  if chunk == "dynamic":
    return rng.random(t) < 1.0 / mean
  return (np.arange(t) + 1) % int(chunk) == 0


def _visible_pairs(ends, window):
  """(chunk-attention visible score entries, causal full-attention entries) for one row."""
  t = ends.shape[0]
  raw = np.minimum(np.arange(t) + 1, window).sum()
  entries = np.cumsum(ends).sum()  # query t sees every chunk closed at or before t
  return int(raw + entries), t * (t + 1) // 2


def _implementations(backend):
  if backend == "gpu":
    return [("xla", False), ("pallas_gpu", False)]
  if backend == "tpu":
    return [("xla", False), ("pallas_tpu", False)]
  return [("xla", False), ("pallas_gpu", True), ("pallas_tpu", True)]


def _attention_case(args, rng, t, chunk, dtype):
  b, h, kh, d = args.batch, args.heads, args.kv_heads, args.head_dim
  ends = np.stack([_layout(rng, t, chunk, args.dynamic_mean) for _ in range(b)])
  capacity = max(128, -(-int(ends.sum(1).max()) // 128) * 128)
  seg = jnp.zeros((b, t), jnp.int32)
  _, _, entry_ends, entry_seg, _, _ = kernels.chunk_structure(jnp.asarray(ends), seg, capacity)
  f = lambda *s: jnp.asarray(rng.standard_normal(s, np.float32), dtype)
  tensors = (f(b, t, h, d), f(b, t, kh, d), f(b, t, kh, d), f(b, capacity, kh, d),
             f(b, capacity, kh, d))
  return ends, capacity, tensors, (seg, entry_ends, entry_seg)


def _bench_attention(args, backend, t, chunk, dtype_name):
  rng = np.random.default_rng(0)
  dtype = _DTYPES[dtype_name]
  ends, capacity, (q, k, v, ek, ev), (seg, entry_ends, entry_seg) = _attention_case(
      args, rng, t, chunk, dtype)
  b, h, d = args.batch, args.heads, args.head_dim
  visible, causal = (sum(x) for x in zip(*[_visible_pairs(e, args.window) for e in ends],
                                          strict=True))
  flops = {"chunk": 4 * d * h * visible, "full": 4 * d * h * causal}  # QK^T and PV, forward
  rows = []
  reference_out = None
  impls = _implementations(backend) + [("full", False)]
  for impl, interpret in impls:
    if impl == "full":
      full_impl = "cudnn" if backend == "gpu" else "xla"
      score_gb = 0 if full_impl == "cudnn" else 4 * b * h * t * t / 1e9
      fn = lambda q, k, v, ek, ev, full_impl=full_impl: jax.nn.dot_product_attention(
          q, k, v, is_causal=True, implementation=full_impl)
      work = flops["full"]
    else:
      score_gb = 4 * b * h * t * (2 * args.window + capacity) / 1e9 if impl == "xla" else 0
      fn = lambda q, k, v, ek, ev, impl=impl, interpret=interpret: kernels.chunk_attention(
          q, k, v, seg, ek, ev, entry_ends, entry_seg, window=args.window, implementation=impl,
          interpret=interpret)
      work = flops["chunk"]
    row = dict(op="chunk_attention" if impl != "full" else "full_causal", impl=impl, T=t,
               M=chunk, dtype=dtype_name, capacity=capacity, visible_scores=work // (4 * d),
               interpret=interpret)
    if score_gb * 3 > args.xla_limit_gb:
      rows.append(dict(row, status=f"skipped: ~{3 * score_gb:.0f} GB of dense scores"))
      continue
    loss = lambda *x, fn=fn: jnp.sum(fn(*x).astype(jnp.float32))
    fwd = jax.jit(fn)
    fwd_bwd = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4)))
    try:
      row["fwd_ms"] = _timed(fwd, q, k, v, ek, ev, reps=args.reps)
      row["fwd_bwd_ms"] = _timed(fwd_bwd, q, k, v, ek, ev, reps=args.reps)
    except Exception as e:  # noqa: BLE001 -- one failing configuration must not end the sweep
      rows.append(dict(row, status=f"failed: {type(e).__name__}: {str(e)[:300]}"))
      continue
    row["fwd_tflops"] = work / row["fwd_ms"] / 1e9
    row["fwd_bwd_tflops"] = 3.5 * work / row["fwd_bwd_ms"] / 1e9  # backward ~2.5x forward
    if impl != "full":
      out = np.asarray(fwd(q, k, v, ek, ev), np.float32)
      if impl == "xla":
        reference_out = out
      elif reference_out is not None:
        row["max_abs_err_vs_xla"] = float(np.abs(out - reference_out).max())
    rows.append(dict(row, status="ok"))
  return rows


def _bench_pool(args, backend, t, chunk, dtype_name):
  rng = np.random.default_rng(1)
  dtype = _DTYPES[dtype_name]
  b, n = args.batch, 2 * args.head_dim
  ends = jnp.asarray(np.stack([_layout(rng, t, chunk, args.dynamic_mean) for _ in range(b)]))
  capacity = max(128, -(-int(ends.sum(1).max()) // 128) * 128)
  seg = jnp.zeros((b, t), jnp.int32)
  values, logits = (jnp.asarray(rng.standard_normal((b, t, n), np.float32), dtype)
                    for _ in range(2))
  slot_bias = jnp.zeros((16, n), jnp.float32)
  rows = []
  for impl, interpret in _implementations(backend):
    fn = lambda v, z, s, impl=impl, interpret=interpret: kernels.segment_pool(
        v, z, ends, seg, capacity=capacity, slot_bias_SxN=s, implementation=impl,
        interpret=interpret)[0]
    loss = lambda *x, fn=fn: jnp.sum(fn(*x).astype(jnp.float32))
    row = dict(op="segment_pool", impl=impl, T=t, M=chunk, dtype=dtype_name, channels=n,
               capacity=capacity, interpret=interpret)
    try:
      row["fwd_ms"] = _timed(jax.jit(fn), values, logits, slot_bias, reps=args.reps)
      row["fwd_bwd_ms"] = _timed(jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))), values,
                                 logits, slot_bias, reps=args.reps)
    except Exception as e:  # noqa: BLE001
      rows.append(dict(row, status=f"failed: {type(e).__name__}: {str(e)[:300]}"))
      continue
    rows.append(dict(row, status="ok"))
  return rows


def _print(rows):
  print(f"{'op':16} {'impl':11} {'T':>6} {'M':>7} {'dtype':5} {'fwd ms':>9} {'f+b ms':>9} "
        f"{'fwd TF/s':>9} {'f+b TF/s':>9} {'err':>8}  status")
  fmt = lambda x, spec, width: format(x, spec) if isinstance(x, float) else "-".rjust(width)
  for r in rows:
    print(f"{r['op']:16} {r['impl']:11} {r['T']:>6} {str(r['M']):>7} {r['dtype']:5} "
          f"{fmt(r.get('fwd_ms'), '9.3f', 9)} {fmt(r.get('fwd_bwd_ms'), '9.3f', 9)} "
          f"{fmt(r.get('fwd_tflops'), '9.2f', 9)} {fmt(r.get('fwd_bwd_tflops'), '9.2f', 9)} "
          f"{fmt(r.get('max_abs_err_vs_xla'), '8.1e', 8)}  {r['status']}", flush=True)


def main():
  args = _parse()
  device = jax.devices()[0]
  backend = jax.default_backend()
  record = dict(
      date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
      device=device.device_kind, backend=backend, jax_version=jax.__version__,
      config={k: v for k, v in vars(args).items() if k != "out"},
      note=("CPU: Pallas timings are interpret mode, a correctness record, not speed"
            if backend == "cpu" else "TFLOP/s count only visible score entries"),
      results=[])
  print(f"device: {device.device_kind} ({backend}), jax {jax.__version__}")
  for t in args.seq:
    for chunk in args.chunks:
      for dtype_name in args.dtypes:
        rows = _bench_attention(args, backend, t, chunk, dtype_name)
        rows += _bench_pool(args, backend, t, chunk, dtype_name)
        _print(rows)
        record["results"] += rows
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  name = "".join(c if c.isalnum() else "-" for c in device.device_kind.lower())
  path = out / f"{stamp}_{name}{'_small' if args.small else ''}.json"
  path.write_text(json.dumps(record, indent=1))
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
