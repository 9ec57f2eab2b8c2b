"""Executed against needed tiles of every chunk-attention kernel, from their loop bounds (CPU).

  python -m bench.kernel_tiles [--small] [--out bench/results]
    -> bench/results/kernel_tiles.{md,json}

Per kernel (``kernels.tiles.KERNELS``: the GPU forward, dq and dk/dv kernel, the last counted over
raw-key and entry columns apart, the Mosaic GPU forward, and the TPU ones, whose grid also walks
a static worst case), per layout (the accelerator bench's: Qwen3-0.6B's window W = 128 and G = 2
query heads per kv head, one document, entries every M = 4 tokens or at Bernoulli(1/4) ends; the
same with 16 documents; full attention as the kernel runs it, a whole-row window and no entries)
and per tile set (the GPU and TPU defaults of ``kernels.AttentionBlockSizes`` and its per-device
table's H200 entry, the latter also with ``forward="mosaic"``): executed tiles / needed tiles
(tiles holding a visible score; the goal: <= 1.10), executed pairs / useful pairs (the masked
share inside the tiles run) and the tiles that build a mask. No device and no timing: the counts
follow from the layout and the loop bounds alone.
"""

from __future__ import annotations

import argparse
import os
import sys

if __package__ in (None, ""):  # python bench/kernel_tiles.py: make the repo root importable
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dataclasses

import numpy as np

from bench import results_io
from kernels import AttentionBlockSizes
from kernels import tiles as tiles_lib

WINDOW = 128
GROUP = 2  # query heads per kv head: Qwen3-0.6B's 16 over 8
GOAL = 1.10  # executed tiles within 10% of the needed ones
TILE_SETS = {  # the default tiles of each platform and the per-device table's Hopper entry
    "gpu default": AttentionBlockSizes.gpu(),
    "gpu H200": AttentionBlockSizes.gpu("NVIDIA H200"),
    "mgpu H200": dataclasses.replace(AttentionBlockSizes.gpu("NVIDIA H200"), forward="mosaic"),
    "tpu default": AttentionBlockSizes.tpu(),
}


def layouts(t: int, rng) -> dict[str, tuple[np.ndarray, np.ndarray, int]]:
  """name -> (segment_ids_T, entry_ends_C, window): the benchmark's rows."""
  one_doc = np.zeros(t, np.int64)
  docs = np.repeat(np.arange(16), t // 16)
  fixed_ends = np.flatnonzero((np.arange(t) + 1) % 4 == 0)
  dynamic_ends = np.flatnonzero(rng.random(t) < 0.25)
  # With documents, chunks restart at each document start (every M-th token of the document).
  doc_ends = np.flatnonzero((np.arange(t) % (t // 16) + 1) % 4 == 0)
  return {
      "fixed M=4": (one_doc, fixed_ends, WINDOW),
      "dynamic mean 4": (one_doc, dynamic_ends, WINDOW),
      "fixed M=4, 16 documents": (docs, doc_ends, WINDOW),
      "full (window = T)": (one_doc, np.zeros(0, np.int64), t),
  }


def rows(seq_lens: list[int]) -> list[dict]:
  out = []
  rng = np.random.default_rng(0)
  for t in seq_lens:
    for name, (seg, ends, window) in layouts(t, rng).items():
      c = max(len(ends), 1)
      # Entry capacity padded to 128, as the benchmark's packed buffers.
      ends_c = np.concatenate([ends, np.full(-(-c // 128) * 128 - len(ends), tiles_lib.PAD_END)])
      for kernel, tile_set in ((k, s) for k in tiles_lib.KERNELS for s in TILE_SETS
                               if s.startswith(k.split("_")[0])):
        if kernel.startswith("gpu"):
          tiles = tiles_lib.gpu_tiles(TILE_SETS[tile_set], t, len(ends_c), GROUP)
        elif kernel.startswith("mgpu"):
          tiles = tiles_lib.mgpu_tiles(TILE_SETS[tile_set], t, len(ends_c), GROUP)
        else:
          tiles = tiles_lib.tpu_tiles(TILE_SETS[tile_set], t, len(ends_c))
        n = tiles_lib.count(kernel, seg, ends_c, window, tiles)
        out.append(dict(T=t, layout=name, kernel=kernel, tile_set=tile_set,
                        tiles=list(vars(tiles).values()),
                        executed=n.executed, needed=n.needed, missed=n.missed,
                        tile_ratio=round(n.tile_ratio, 4), executed_pairs=n.executed_pairs,
                        useful_pairs=n.useful_pairs, pair_ratio=round(n.pair_ratio, 4),
                        grid_steps=n.grid_steps, masked=n.masked,
                        within_goal=n.tile_ratio <= GOAL))
  return out


def markdown(rows_: list[dict]) -> str:
  lines = [
      "# Chunk-attention kernels: executed against needed tiles (from the loop bounds)", "",
      "Written by `python -m bench.kernel_tiles` (no device: counts from the layout and each "
      "kernel's loop bounds, `kernels/tiles.py`). Per query head and row. Tiles (bq, bk, bc, "
      "bq_bwd, bk_bwd, bc_bwd, forward tokens per program, Mosaic rows per program): the "
      "GPU / TPU defaults of `AttentionBlockSizes` and its per-device table's H200 entry, the "
      "latter also with the Mosaic GPU forward (`mgpu H200`, 64-row tiles). "
      f"**tiles x** = executed / needed tiles (goal <= {GOAL:.2f}); **pairs x** = pairs the "
      "executed tiles cover / visible pairs (the masked share inside them); **grid steps**: "
      "inner steps the grid walks (TPU: a static worst case, skipped steps cost grid overhead; "
      "Mosaic GPU: K/V blocks streamed, one per step for both 64-row tiles of a program); "
      "**masked**: executed tiles that build and apply a mask (the rest run unmasked).",
      "", "| T | layout | kernel | tile set | tiles | executed | needed | tiles x | pairs x | "
      "masked | grid steps |", "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows_:
    flag = "" if r["within_goal"] else " **over**"
    lines.append(f"| {r['T']} | {r['layout']} | {r['kernel']} | {r['tile_set']} | "
                 f"{'/'.join(map(str, r['tiles']))} | {r['executed']:,} | {r['needed']:,} | "
                 f"{r['tile_ratio']:.3f}{flag} | {r['pair_ratio']:.2f} | {r['masked']:,} | "
                 f"{r['grid_steps']:,} |")
  over = [r for r in rows_ if not r["within_goal"]]
  lines += ["", f"{len(rows_) - len(over)} of {len(rows_)} rows within the goal; no kernel "
            f"misses a needed tile: {all(r['missed'] == 0 for r in rows_)}."]
  return "\n".join(lines) + "\n"


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--small", action="store_true", help="T = 1024 only (seconds)")
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
  args = parser.parse_args(argv)
  seq_lens = [1024] if args.small else [4096, 32768]
  result = rows(seq_lens)
  text = markdown(result)
  print(text)
  name = "kernel_tiles_small" if args.small else "kernel_tiles"
  results_io.write_json(args.out, f"{name}.json", dict(window=WINDOW, goal=GOAL, rows=result))
  with open(os.path.join(args.out, f"{name}.md"), "w") as f:
    f.write(text)


if __name__ == "__main__":
  main()
