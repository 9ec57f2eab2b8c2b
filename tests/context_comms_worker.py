"""The collectives of one layer of each attention kind under context = 4, from compiled HLO.

Run by tests/test_context_comms.py in ONE fresh process with 4 fake CPU devices (the device
count is fixed before JAX starts). For each of ``KINDS``, layers of
tests/context_parallel_worker.py's ``LAYERS`` (full; fixed plain and overlapping; DeepSeek-V4
layout with the lightning indexer's top-k; dynamic with router and with delimiter), it compiles,
with XLA's optimisations, a one-layer model's forward pass and its training gradient (forward +
backward of the loss) under context = 4, rows of ``cp.HLO_SEQ_LEN`` tokens, and writes every
collective of the optimised HLO (op, dtype, result shape) to ``--out`` (JSON: kind -> pass ->
list, and kind -> "params": the one-layer model's parameter count).

  python tests/context_comms_worker.py --out collectives.json
  python tests/context_comms_worker.py --out collectives.json --table   # also prints the table

The doc's communication table (docs/context_parallel.md) is what ``--table`` prints.
"""

import argparse
import json
import os
import re
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from chunkformer import objective  # noqa: E402
from chunkformer import runtime as runtime_lib  # noqa: E402
from tests import context_parallel_worker as cp  # noqa: E402

# A collective's line of optimised HLO: its result type (one array, or a tuple of arrays when
# XLA combined several collectives into one; long tuples carry /*index=5*/ comments) and its op.
LINE = re.compile(r"= (\([^\n]*?\)|\w+\[[\d,]*\]\S*) (" + "|".join(cp.COLLECTIVES)
                  + r")(?:-start)?\(")
ARRAY = re.compile(r"(\w+)\[([\d,]*)\]")
KINDS = ("full", "fixed", "overlap", "v4_indexer", "dynamic_router", "dynamic_delimiter")
MESH = (1, 1, 4, 1)


def parameter_count(layer: str, devices) -> int:
  """Parameters of the one-layer model (what its weight gradients' all-reduces carry)."""
  rt = runtime_lib.build(cp.make_config(MESH, (layer,), cp.HLO_SEQ_LEN), devices)
  return sum(x.size for x in jax.tree.leaves(rt.abstract_state.params))


def compiled_collectives(layer: str, devices, backward: bool) -> list[dict]:
  """Collectives of a one-layer model's forward (or loss gradient) under context = 4."""
  config = cp.make_config(MESH, (layer,), cp.HLO_SEQ_LEN)
  rt = runtime_lib.build(config, devices)
  abstract = {k: jax.ShapeDtypeStruct((cp.BATCH, cp.HLO_SEQ_LEN), v.dtype,
                                      sharding=rt.batch_sharding)
              for k, v in cp.make_batch(config.model.vocab_size).items()}

  def forward(p, b):
    return rt.model.apply({"params": p}, b["inputs"], b["positions"], b["segment_ids"],
                          mutable=objective.AUX_COLLECTIONS)[0]

  def gradient(p, b):
    return jax.grad(lambda q: objective.loss_fn(q, rt.model, b, jax.random.key(0))[0])(p)

  with rt.context():
    lowered = jax.jit(gradient if backward else forward).lower(rt.abstract_state.params,
                                                              abstract)
    return collectives(lowered.compile().as_text())


def collectives(hlo: str) -> list[dict]:
  """Every array a collective of ``hlo`` produces (each array of a combined one on its own):
  op, dtype, shape, elements, and ``combined``: how many arrays its collective produced."""
  found = []
  for result, op in LINE.findall(hlo):
    arrays = ARRAY.findall(result)
    for dtype, dims in arrays:
      shape = [int(d) for d in dims.split(",") if d]
      found.append({"op": op, "dtype": dtype, "shape": shape,
                    "elements": int(np.prod(shape)), "combined": len(arrays)})
  return found


def table(found: dict) -> str:
  """Markdown rows: kind, pass, float collectives (count x op [shape]; all-reduces summed),
  floats moved per row, the integer collectives."""
  lines = []
  for kind, passes in found.items():
    for name, items in passes.items():
      if name == "params":
        continue
      floats = [c for c in items if c["dtype"] == "f32"]
      shaped = Counter((c["op"], tuple(c["shape"])) for c in floats if c["op"] != "all-reduce")
      parts = [f"{n} {op} {list(shape)}" for (op, shape), n in sorted(shaped.items())]
      reduced = [c["elements"] for c in floats if c["op"] == "all-reduce"]
      if reduced:
        parts.append(f"all-reduce of {len(reduced)} arrays ({sum(reduced):,} floats)")
      moved = sum(c["elements"] for c in floats if c["op"] != "all-reduce") // cp.BATCH
      others = Counter(c["op"] for c in items if c["dtype"] != "f32")
      lines.append(f"| {kind} | {name} | {', '.join(parts) or '-'} | {moved:,} | "
                   + ", ".join(f"{n} {op}" for op, n in sorted(others.items())) + " |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", required=True)
  parser.add_argument("--kinds", default=",".join(KINDS))
  parser.add_argument("--table", action="store_true")
  args = parser.parse_args()
  devices = jax.devices()
  assert len(devices) >= 4, devices
  # A production compile (tests/conftest.py turns the backend's optimisations off for speed;
  # the HLO passes that make the collectives run either way).
  jax.config.update("jax_disable_most_optimizations", False)
  found = {}
  for kind in args.kinds.split(","):
    layer = cp.LAYERS[kind]
    found[kind] = {name: compiled_collectives(layer, devices[:4], backward)
                   for name, backward in (("forward", False), ("gradient", True))}
    found[kind]["params"] = parameter_count(layer, devices[:4])
    with open(args.out, "w") as f:  # after each kind: a slow run leaves what it has
      json.dump(found, f)
  if args.table:
    print(table(found))


if __name__ == "__main__":
  main()
