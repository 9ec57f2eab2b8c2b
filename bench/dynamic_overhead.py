"""Training-step cost of dynamic chunking against fixed chunking at the same size and budget.

  python bench/dynamic_overhead.py [--batch_size 32] [--seq_len 256] [--rounds 5] [--steps 4]

Models: configs/kv_chunk.py (fixed M = 4) against configs/kv_dynamic.py (learned router,
target 4 tokens per entry) and configs/kv_delimiter.py (delimiter rule, ~4.2 tokens per entry):
the same transformer, window and pooling, differing only in where chunks end. Each variant's
jitted training step (chunkformer.trainer.make_train_step: forward, backward, AdamW update) is
compiled, then the variants are timed in interleaved rounds of ``--steps`` steps on one
device-resident batch, so that load from other processes hits all of them alike; the table
reports each variant's median step time and its throughput relative to the fixed model
(goal: dynamic >= 0.85x). Writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402

from bench import results_io  # noqa: E402
from chunkformer import config as config_lib  # noqa: E402
from chunkformer import runtime as runtime_lib  # noqa: E402
from chunkformer import trainer  # noqa: E402
from configs import kv_chunk, kv_delimiter, kv_dynamic  # noqa: E402

VARIANTS = {"fixed": kv_chunk, "dynamic_router": kv_dynamic, "dynamic_delimiter": kv_delimiter}


def _config(module, batch_size: int, seq_len: int, implementation: str) -> config_lib.Config:
  c = module.get_config()
  c.data.batch_size = batch_size
  c.data.seq_len = seq_len
  if c.model.attention.kind == "dynamic":
    c.model.attention.implementation = implementation
  return config_lib.from_dict(c.to_dict())


class _Variant:
  """A compiled training step with its state and one device-resident batch."""

  def __init__(self, config: config_lib.Config):
    self.config = config
    self.rt = runtime_lib.build(config)
    self.state = self.rt.init_state()
    self.step = trainer.make_train_step(self.rt)
    self.times: list[float] = []
    with self.rt.context():
      self.batch = self.rt.batch("train", 0)
      began = time.perf_counter()
      self.state, sums, _ = self.step(self.state, self.batch)
      jax.block_until_ready(sums)
      self.compile_s = time.perf_counter() - began
      self.sums = jax.device_get(sums)

  def time_steps(self, steps: int) -> None:
    with self.rt.context():
      began = time.perf_counter()
      for _ in range(steps):
        self.state, sums, _ = self.step(self.state, self.batch)
      jax.block_until_ready(sums)
    self.times.append((time.perf_counter() - began) / steps)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--seq_len", type=int, default=256)
  parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
  parser.add_argument("--steps", type=int, default=4, help="timed steps per round")
  parser.add_argument("--implementation", default="xla", help="kernels for the dynamic kind")
  parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
  args = parser.parse_args()

  variants = {name: _Variant(_config(module, args.batch_size, args.seq_len,
                                     args.implementation))
              for name, module in VARIANTS.items()}
  for _ in range(args.rounds):
    for variant in variants.values():
      variant.time_steps(args.steps)
  fixed_s = statistics.median(variants["fixed"].times)
  tokens = args.batch_size * args.seq_len
  result = {
      "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
      "command": "python bench/dynamic_overhead.py " + " ".join(sys.argv[1:]),
      "platform": jax.devices()[0].platform, "device_kind": jax.devices()[0].device_kind,
      "devices": jax.device_count(), "host": platform.node(), "jax": jax.__version__,
      "cpu_count": os.cpu_count(), "load_average_1m": os.getloadavg()[0],
      "batch_size": args.batch_size, "seq_len": args.seq_len, "rounds": args.rounds,
      "steps_per_round": args.steps, "implementation": args.implementation, "variants": {},
  }
  print(f"{'variant':<18} {'step ms':>9} {'min ms':>8} {'tokens/s':>10} {'vs fixed':>9} "
        f"{'compile s':>10}")
  for name, v in variants.items():
    median = statistics.median(v.times)
    attn = v.config.model.attention
    result["variants"][name] = {
        "config": VARIANTS[name].__name__.replace(".", "/") + ".py",
        "kind": attn.kind, "boundary": attn.boundary if attn.kind == "dynamic" else None,
        "step_s_median": median, "step_s_min": min(v.times), "step_s_rounds": v.times,
        "tokens_per_s": tokens / median, "throughput_vs_fixed": fixed_s / median,
        "compile_s": v.compile_s,
    }
    print(f"{name:<18} {median * 1e3:9.1f} {min(v.times) * 1e3:8.1f} {tokens / median:10,.0f} "
          f"{fixed_s / median:8.2f}x {v.compile_s:10.1f}")
  ratio = result["variants"]["dynamic_router"]["throughput_vs_fixed"]
  result["goal"] = "dynamic_router throughput >= 0.85x fixed"
  result["goal_met"] = ratio >= 0.85
  print(f"goal (router >= 0.85x fixed): {'met' if ratio >= 0.85 else 'NOT met'} ({ratio:.2f}x)")
  results_io.write_json(args.out, f"dynamic_overhead_{result['platform']}.json", result)


if __name__ == "__main__":
  main()
