"""Compiled training-step memory per attention kind at long T on a tiny-width model (CPU).

  python -m bench.long_context_memory --seq_len 8192 [--layers 1] [--kinds fixed,dynamic]

Compiles (never runs) the training step of configs/lm/qwen3_tiny.py (width 128, 4 heads of 32,
window 32; ``--layers`` layers, one row) at ``--seq_len`` and prints ``memory_analysis()``'s
temporary bytes per kind and their ratio to the first kind's: where the bytes that grow with T
go, without the 0.6B model's compile times (bench/scale_plan.py compiles that one). Writes
nothing; the numbers go to bench/results/measurements.md with their date and commit.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

if __package__ in (None, ""):  # run as a file: bench/ must not shadow the top-level kernels
  sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

import jax  # noqa: E402

from chunkformer import config as config_lib  # noqa: E402
from chunkformer import runtime as runtime_lib  # noqa: E402
from chunkformer import trainer  # noqa: E402
from configs.lm import qwen3_tiny  # noqa: E402


def temp_bytes(kind: str, seq_len: int, layers: int) -> tuple[int, float]:
  """(compiled temporary bytes, compile seconds) of one training step of ``kind``."""
  c = qwen3_tiny.get_config(kind)
  c.model.num_layers = layers
  c.data.seq_len, c.data.batch_size = seq_len, 1
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 1, 1
  config = config_lib.from_dict(c.to_dict())
  rt = runtime_lib.build(config)
  with rt.context():
    probe = rt.batch("train", 0)
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=rt.batch_sharding)
           for k, v in probe.items()}
  began = time.perf_counter()
  with rt.context():
    compiled = trainer.make_train_step(rt).lower(rt.abstract_state, batch).compile()
  return int(compiled.memory_analysis().temp_size_in_bytes), time.perf_counter() - began


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--seq_len", type=int, default=8192)
  p.add_argument("--layers", type=int, default=1)
  p.add_argument("--kinds", default="fixed,dynamic")
  args = p.parse_args()
  kinds = args.kinds.split(",")
  first = None
  for kind in kinds:
    temp, seconds = temp_bytes(kind, args.seq_len, args.layers)
    first = first or temp
    print(f"{kind:8} T={args.seq_len} layers={args.layers}: temp {temp / 2**20:,.1f} MiB "
          f"({temp / first:.2f}x {kinds[0]}), compile {seconds:.0f} s", flush=True)


if __name__ == "__main__":
  main()
