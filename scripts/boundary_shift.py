"""Shift invariance of a trained dynamic model's chunk boundaries under inserted filler.

  python scripts/boundary_shift.py --workdir workdirs/kv_dynamic [--max_shift 8] [--batches 2]

Loads the latest checkpoint of a kv run whose first layer is of kind ``dynamic``, inserts
k = 1 .. max_shift random filler tokens after BOS into held-out rows, and reports per k the
fraction of the content's chunk ends that stay on the same content token (first layer: the
boundary owner), with the same measure for fixed chunks of M = chunk_size beside it (unchanged
only when k is a multiple of M). Prints a table and writes JSON to DIR/boundary_shift.json.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from chunkformer import checkpointing, chunking  # noqa: E402
from chunkformer import data as data_lib  # noqa: E402
from chunkformer import runtime as runtime_lib  # noqa: E402
from chunkformer import workdir as workdir_lib  # noqa: E402
from chunkformer.chunking import shift_probe  # noqa: E402
from chunkformer.data import kv  # noqa: E402


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--max_shift", type=int, default=8)
  parser.add_argument("--batches", type=int, default=2, help="held-out batches")
  args = parser.parse_args()

  config = workdir_lib.read_config(args.workdir)
  attn = config.model.layers[0]
  if attn.kind != "dynamic" or config.data.task != "kv":
    raise SystemExit("error: needs a kv run whose first layer has kind 'dynamic'")
  rt = runtime_lib.build(config)
  restored = checkpointing.restore_latest_read_only(args.workdir, config.train,
                                                     rt.abstract_state)
  if restored is None:
    raise SystemExit(f"error: no checkpoint restores in {args.workdir}")
  state, step = restored
  forward = jax.jit(lambda params, tokens: rt.model.apply(
      {"params": params}, tokens, mutable=["intermediates"])[1]["intermediates"])

  def entry_ends(tokens):
    return forward(state.params, tokens)["block_0"]["attn"]["entry_ends"][0]

  filler = tuple(range(kv.FILLER_BASE, kv.FILLER_BASE + config.data.num_filler))
  t, m = config.data.seq_len, attn.chunk_size
  rows = []
  for k in range(1, args.max_shift + 1):
    totals = {"dynamic": [0, 0, 0, 0], "fixed": [0, 0, 0, 0]}
    for i in range(args.batches):
      tokens = data_lib.make_batch(config.data, seed=config.seed, step=i, split="heldout",
                                   process_index=0, process_count=1)["inputs"]
      shifted = shift_probe.insert_filler(tokens, k, filler, seed=k * 1000 + i)
      ends = {"dynamic": (entry_ends(jnp.asarray(tokens)), entry_ends(jnp.asarray(shifted)))}
      grid = chunking.fixed_end_flags(jnp.broadcast_to(jnp.arange(t), tokens.shape), m)
      packed = chunking.packed_layout(grid, jnp.zeros(tokens.shape, jnp.int32), t).entry_ends_BxC
      ends["fixed"] = (packed, packed)  # the grid does not move with the content
      for name, (a, b) in ends.items():
        r = shift_probe.boundary_agreement(np.asarray(a), np.asarray(b), k, t)
        totals[name][0] += r["boundaries_both"]
        totals[name][1] += r["boundaries_either"]
        totals[name][2] += r["unchanged_after_resync"]
        totals[name][3] += 1
    row = {"k": k}
    for name, (both, either, after, n) in totals.items():
      row[name] = {"unchanged": both / max(either, 1), "unchanged_after_resync": after / n,
                   "boundaries_either": either}
    rows.append(row)
  print(f"checkpoint step {step}; {args.batches} held-out batches; first layer, M = {m}")
  print(f"{'k':>3} {'dynamic unchanged':>18} {'after resync':>13} {'fixed unchanged':>16}")
  for row in rows:
    print(f"{row['k']:>3} {row['dynamic']['unchanged']:18.3f} "
          f"{row['dynamic']['unchanged_after_resync']:13.3f} {row['fixed']['unchanged']:16.3f}")
  mean = float(np.mean([row["dynamic"]["unchanged"] for row in rows]))
  print(f"mean over k: dynamic {mean:.3f}, fixed "
        f"{float(np.mean([row['fixed']['unchanged'] for row in rows])):.3f}")
  result = {"workdir": args.workdir, "step": step, "batches": args.batches, "chunk_size": m,
            "boundary": attn.boundary, "per_shift": rows, "dynamic_unchanged_mean": mean}
  path = workdir_lib.write_json(args.workdir, "boundary_shift.json", result)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
