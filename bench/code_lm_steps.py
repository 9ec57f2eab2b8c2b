"""Training step time of each attention kind of the code-LM sweep (configs/sweeps/code_lm.py).

  nice -n 10 python bench/code_lm_steps.py [--steps 20] [--variants full,fixed_m4,...]

For seed 0 of every variant, at exactly the sweep's resolved config: builds the runtime, compiles
the training step, then times ``--steps`` steps on consecutive corpus batches (the data feed
included, as in training). Reports wall seconds per step and process CPU seconds per step
(all threads): on an idle machine the wall time is at most about the CPU time, so CPU time per
step x steps bounds a unit's training wall on quiet cores even when the measurement ran under
load. Prints a table with the load average; writes JSON to bench/results/.
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
from chunkformer import provenance, trainer  # noqa: E402
from chunkformer import runtime as runtime_lib  # noqa: E402
from chunkformer.evaluation.sweep import config as sweep_config  # noqa: E402
from configs.sweeps import code_lm  # noqa: E402


def time_variant(config, steps: int) -> dict[str, float]:
  rt = runtime_lib.build(config)
  state = rt.init_state()
  step = trainer.make_train_step(rt)
  with rt.context():
    began = time.perf_counter()
    state, sums, _ = step(state, rt.batch("train", 0))
    jax.block_until_ready(sums)
    compile_s = time.perf_counter() - began
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(1, steps + 1):
      state, sums, _ = step(state, rt.batch("train", i))
    jax.block_until_ready(sums)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
  if rt.feed is not None:
    rt.feed.close()
  return {"compile_s": compile_s, "wall_s_per_step": wall / steps,
          "cpu_s_per_step": cpu / steps}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=20, help="timed steps after compilation")
  parser.add_argument("--variants", default=",".join(code_lm.VARIANTS))
  parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
  args = parser.parse_args()

  sweep = sweep_config.resolve(code_lm.get_config(), "/nonexistent/code_lm_bench")
  by_name = {v.name: v for v in sweep.variants}
  load_before = os.getloadavg()
  rows, results = [], {}
  for name in args.variants.split(","):
    variant = by_name[f"{name}_seed0"]
    result = time_variant(variant.config, args.steps)
    results[name] = result
    train_s = result["cpu_s_per_step"] * code_lm.STEPS
    rows.append((name, f"compile {result['compile_s']:.1f} s, "
                       f"{result['wall_s_per_step'] * 1e3:.0f} ms wall / "
                       f"{result['cpu_s_per_step'] * 1e3:.0f} ms CPU per step; "
                       f"{code_lm.STEPS} steps <= {train_s / 60:.1f} min quiet"))
    print(*rows[-1], sep="  ", flush=True)  # progress; the table follows at the end
  load_after = os.getloadavg()
  total = sum(r["cpu_s_per_step"] for r in results.values()) * code_lm.STEPS * code_lm.SEEDS
  commit = provenance.commit()
  rows.append(("all units (training only)",
               f"{total / 60:.0f} min upper bound on quiet cores ({code_lm.SEEDS} seeds)"))
  rows.append(("load average (1 min) before / after",
               f"{load_before[0]:.1f} / {load_after[0]:.1f}"))
  results_io.print_rows(rows)
  results_io.write_json(args.out, "code_lm_steps_cpu.json", {
      "command": " ".join(["python", "bench/code_lm_steps.py"] + sys.argv[1:]),
      "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
      "commit": commit, "load_before": load_before, "load_after": load_after,
      "steps_timed": args.steps, "sweep_steps": code_lm.STEPS, "seeds": code_lm.SEEDS,
      "batch_size": code_lm.BATCH, "seq_len": code_lm.SEQ_LEN, "variants": results,
      "training_upper_bound_s": total})


if __name__ == "__main__":
  main()
