"""Training throughput of a medium model against this machine's own matmul speed.

  python bench/train_step.py [--batch_size 4] [--steps 3] [--matmul_size 2048]

Model: d=256, 4 layers, 4 heads of 64, SwiGLU 1024, full attention, T=1024, byte vocabulary.
Model FLOPs per training step are counted analytically: 6 * N * tokens for the N parameters
that enter matmuls (the tied embedding counts once, as the output layer), plus attention
12 * L * T^2 * H * D per row (scores and weighted sum, forward and two backward; the full
T x T square, which is what the XLA attention computes under a causal mask). The same run
times a float32 square matmul to measure the machine's achievable GFLOP/s; the ratio is the
model FLOPs utilisation against that ceiling. Prints a table; writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from bench import results_io  # noqa: E402
from chunkformer import config as config_lib  # noqa: E402
from chunkformer import runtime as runtime_lib  # noqa: E402
from chunkformer import trainer  # noqa: E402
from configs import base  # noqa: E402


def medium_config(batch_size: int) -> config_lib.Config:
  c = base.get_config()
  c.model.update(dict(vocab_size=256, num_layers=4, d_model=256, num_heads=4, num_kv_heads=4,
                      head_dim=64, mlp_dim=1024))
  c.data.update(dict(task="kv", seq_len=1024, batch_size=batch_size, num_symbols=128))
  c.train.steps = 1000
  return config_lib.from_dict(c.to_dict())


def matmul_gflops(n: int, repeats: int) -> float:
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  f = jax.jit(jnp.dot)
  f(a, b).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    began = time.perf_counter()
    f(a, b).block_until_ready()
    best = min(best, time.perf_counter() - began)
  return 2 * n**3 / best / 1e9


def step_flops(config: config_lib.Config, params) -> tuple[int, int, int]:
  """(matmul parameters N, dense FLOPs, attention FLOPs) of one training step."""
  m, d = config.model, config.data
  n = sum(int(x.size) for x in jax.tree.leaves(params) if x.ndim >= 2)
  if not m.tie_embeddings:
    n -= m.vocab_size * m.d_model  # the input embedding is a lookup, not a matmul
  tokens = d.batch_size * d.seq_len
  attention = 12 * m.num_layers * d.seq_len**2 * m.num_heads * m.head_dim * d.batch_size
  return n, 6 * n * tokens, attention


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch_size", type=int, default=4)
  parser.add_argument("--steps", type=int, default=3, help="timed steps after compilation")
  parser.add_argument("--matmul_size", type=int, default=2048)
  parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
  args = parser.parse_args()

  config = medium_config(args.batch_size)
  rt = runtime_lib.build(config)
  state = rt.init_state()
  step = trainer.make_train_step(rt)
  with rt.context():
    began = time.perf_counter()
    batch = rt.batch("train", 0)
    data_s = time.perf_counter() - began
    began = time.perf_counter()
    state, sums, _ = step(state, batch)
    jax.block_until_ready(sums)
    compile_s = time.perf_counter() - began
    began = time.perf_counter()
    for _ in range(args.steps):
      state, sums, _ = step(state, batch)  # the same device-resident batch: the step alone
    jax.block_until_ready(sums)
    step_s = (time.perf_counter() - began) / args.steps
  ceiling = matmul_gflops(args.matmul_size, repeats=5)

  n, dense, attention = step_flops(config, state.params)
  tokens = config.data.batch_size * config.data.seq_len
  achieved = (dense + attention) / step_s / 1e9
  result = {
      "platform": jax.devices()[0].platform, "device_kind": jax.devices()[0].device_kind,
      "devices": jax.device_count(), "host": platform.node(), "jax": jax.__version__,
      "model": {"d_model": 256, "num_layers": 4, "num_heads": 4, "head_dim": 64,
                "mlp_dim": 1024, "seq_len": config.data.seq_len,
                "batch_size": config.data.batch_size, "matmul_params": n},
      "step_s": step_s, "compile_s": compile_s, "data_s_per_batch": data_s,
      "tokens_per_s": tokens / step_s, "model_gflop_per_step": (dense + attention) / 1e9,
      "attention_share": attention / (dense + attention), "achieved_gflops": achieved,
      "matmul_gflops": ceiling, "utilisation": achieved / ceiling,
  }
  rows = [("platform", f"{result['platform']} x{result['devices']} ({result['device_kind']})"),
          ("model", f"d=256 L=4 H=4x64 F=1024 T={config.data.seq_len} "
                    f"B={config.data.batch_size}, {n / 1e6:.2f}M matmul params"),
          ("compile + first step", f"{compile_s:.2f} s"),
          ("train step", f"{step_s * 1e3:.1f} ms"),
          ("training tokens/s", f"{tokens / step_s:,.0f}"),
          ("model GFLOP / step", f"{(dense + attention) / 1e9:.1f} "
                                 f"(attention {100 * attention / (dense + attention):.0f}%)"),
          ("achieved GFLOP/s", f"{achieved:.1f}"),
          (f"matmul {args.matmul_size}^3 GFLOP/s", f"{ceiling:.1f}"),
          ("utilisation of matmul speed", f"{100 * achieved / ceiling:.0f}%"),
          ("host data, one batch", f"{data_s * 1e3:.0f} ms")]
  results_io.print_rows(rows)
  results_io.write_json(args.out, f"train_step_{result['platform']}{result['devices']}.json",
                        result)


if __name__ == "__main__":
  main()
