"""Compile time of the training step with and without the scan over layers, by depth.

  python bench/scan_compile.py [--layers 4,16] [--config configs/lm/qwen3_tiny.py]

Compiles (lower + compile, nothing runs) the qwen3_tiny training step (remat ``full``) with
``model.scan_layers`` on and off at each depth, one after the other in one process, and writes
bench/results/scan_compile.{md,json} with the machine's load average (compile times on shared
cores are upper bounds).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # as a file, bench/ comes first: bench/kernels.py would shadow kernels

import jax  # noqa: E402

from chunkformer import config as config_lib  # noqa: E402
from chunkformer import provenance, trainer  # noqa: E402
from chunkformer import runtime as runtime_lib  # noqa: E402
from configs.lm import qwen3_tiny  # noqa: E402


def compile_seconds(layers: int, scan: bool) -> float:
  c = qwen3_tiny.get_config()
  c.model.num_layers = layers
  c.model.scan_layers = scan
  rt = runtime_lib.build(config_lib.from_dict(c.to_dict()), jax.devices()[:1])
  step = trainer.make_train_step(rt)
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding)
           for k, v in rt.batch("train", 0).items()}
  began = time.perf_counter()
  with rt.context():
    step.lower(rt.abstract_state, batch).compile()
  return time.perf_counter() - began


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--layers", default="4,16")
  p.add_argument("--out", default="bench/results/scan_compile")
  args = p.parse_args()
  jax.config.update("jax_enable_compilation_cache", False)  # time real compiles
  load_start = os.getloadavg()
  rows = []
  for layers in (int(x) for x in args.layers.split(",")):
    for scan in (False, True):
      rows.append(dict(layers=layers, scan_layers=scan, compile_s=compile_seconds(layers, scan)))
      print(rows[-1], flush=True)
  meta = dict(command="python bench/scan_compile.py --layers " + args.layers,
              date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
              commit=provenance.commit(),
              load_start=[round(x, 1) for x in load_start],
              load_end=[round(x, 1) for x in os.getloadavg()], rows=rows)
  with open(args.out + ".json", "w") as f:
    json.dump(meta, f, indent=2)
  lines = ["# Compile time of the qwen3_tiny training step, scanned vs unrolled layers", "",
           f"`{meta['command']}`, {meta['date']}, commit {meta['commit']}, 1 CPU device; load "
           f"average {meta['load_start']} at start, {meta['load_end']} at end on 2 shared "
           "cores (upper bounds).", "", "| layers | scan_layers | compile s |", "|---|---|---|"]
  lines += [f"| {r['layers']} | {r['scan_layers']} | {r['compile_s']:.1f} |" for r in rows]
  with open(args.out + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
