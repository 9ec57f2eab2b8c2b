"""The corpus pipeline's throughput against the training step's consumption, in one run.

  python bench/data_loader.py [--tokenizer bytes|bpe2048] [--batches 200] [--steps 10]

Config: configs/lm/code_small.py (the built-in standard-library corpus; ingested into the cache
on first use, not timed) with its ``data.read_threads``. Measured in this process:

1. loader: tokens/s of a fresh training iterator (Grain read threads + packing + batching in
   its background thread), pulling ``--batches`` batches as fast as possible;
2. step: tokens/s of the jitted training step alone, on one device-resident batch;
3. loop: ``--steps`` training steps fed by the pipeline, and the time the host spent blocked
   waiting for the next batch (what the trainer would wait on the loader).

Goal: loader >= 10x step. Prints a table; writes bench/results/data_loader_<tokenizer>.json
with the command, date, commit and load average (other jobs share these cores).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402

from bench import results_io  # noqa: E402
from chunkformer import config as config_lib  # noqa: E402
from chunkformer import provenance, trainer  # noqa: E402
from chunkformer import runtime as runtime_lib  # noqa: E402
from chunkformer import sharding as sharding_lib  # noqa: E402
from chunkformer.data import feed as feed_lib  # noqa: E402
from configs.lm import code_small  # noqa: E402


def _feed(config: config_lib.Config) -> feed_lib.CorpusFeed:
  d = config.data
  return feed_lib.CorpusFeed(feed_lib.open_for(d.path, d.tokenizer, d.heldout_fraction),
                             seq_len=d.seq_len, rows=d.batch_size, seed=config.seed,
                             shard_index=0, shard_count=1, read_threads=d.read_threads,
                             needles=d.code_needles, near_distance=d.near_distance)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--tokenizer", default="bytes", help="bytes | bpeN (code_small's arg)")
  parser.add_argument("--batches", type=int, default=200, help="batches timed from the loader")
  parser.add_argument("--steps", type=int, default=10, help="timed training steps")
  parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
  args = parser.parse_args()

  config = config_lib.from_dict(code_small.get_config(args.tokenizer).to_dict())
  rt = runtime_lib.build(config)  # ingests the corpus on first use
  tokens_per_batch = config.data.batch_size * config.data.seq_len

  feed = _feed(config)
  began = time.perf_counter()
  first = feed.batch("train", 0)
  first_batch_s = time.perf_counter() - began
  began = time.perf_counter()
  for step in range(1, args.batches + 1):
    feed.batch("train", step)
  loader_tps = args.batches * tokens_per_batch / (time.perf_counter() - began)
  feed.close()

  state = rt.init_state()
  step_fn = trainer.make_train_step(rt)
  with rt.context():
    batch = sharding_lib.global_batch(first, rt.batch_sharding, config.data.batch_size)
    state, sums, _ = step_fn(state, batch)
    jax.block_until_ready(sums)
    began = time.perf_counter()
    for _ in range(args.steps):
      state, sums, _ = step_fn(state, batch)
    jax.block_until_ready(sums)
    step_tps = args.steps * tokens_per_batch / (time.perf_counter() - began)

    waited = 0.0
    began = time.perf_counter()
    for step in range(args.steps):  # the runtime's own feed, as train() uses it
      t0 = time.perf_counter()
      batch = rt.batch("train", step)
      waited += time.perf_counter() - t0
      state, sums, _ = step_fn(state, batch)
    jax.block_until_ready(sums)
    loop_s = time.perf_counter() - began
  rt.feed.close()

  commit = provenance.commit()
  load = os.getloadavg()
  result = {
      "command": "python bench/data_loader.py " + " ".join(sys.argv[1:]),
      "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
      "commit": commit, "load_average_1_5_15": [round(x, 2) for x in load],
      "cpu_count": os.cpu_count(), "config": f"configs/lm/code_small.py:{args.tokenizer}",
      "read_threads": config.data.read_threads, "batch_size": config.data.batch_size,
      "seq_len": config.data.seq_len, "loader_tokens_per_s": loader_tps,
      "loader_first_batch_s": first_batch_s, "step_tokens_per_s": step_tps,
      "ratio": loader_tps / step_tps, "loop_steps": args.steps,
      "loop_wait_share": waited / loop_s,
  }
  rows = [("config", f"{result['config']} (B={config.data.batch_size}, "
                     f"T={config.data.seq_len}, read_threads={config.data.read_threads})"),
          ("loader tokens/s", f"{loader_tps:,.0f} (first batch {first_batch_s:.2f} s)"),
          ("train step tokens/s", f"{step_tps:,.0f}"),
          ("loader / step", f"{loader_tps / step_tps:.1f}x (goal >= 10x)"),
          ("loop: share of time waiting for data", f"{100 * waited / loop_s:.1f}%"),
          ("load average (1, 5, 15 min)", " ".join(f"{x:.2f}" for x in load)),
          ("date, commit", f"{result['date_utc']} UTC, {commit}")]
  results_io.print_rows(rows)
  results_io.write_json(args.out, f"data_loader_{args.tokenizer}.json", result)


if __name__ == "__main__":
  main()
