"""kernels.tiles: the executed/needed tile counts equal a brute-force replay of the kernels'
loops over every program and a pair-by-pair visibility check, and no kernel skips a tile that
holds a visible score."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import PAD_END
from kernels import tiles as tiles_lib


def _layout(t, seed, docs, chunk):
  """Segment ids (documents as runs) and sorted entry ends: chunks of ``chunk`` tokens, or
  random lengths 1..7 (chunk 0), restarting at every document start; padding entries."""
  rng = np.random.default_rng(seed)
  cuts = np.sort(rng.choice(np.arange(1, t), docs - 1, replace=False)) if docs > 1 else []
  seg = np.zeros(t, np.int64)
  for i, cut in enumerate(cuts):
    seg[cut:] = i + 1
  ends, start = [], 0
  for pos in range(t):
    if pos > 0 and seg[pos] != seg[pos - 1]:
      start = pos
    length = chunk or int(rng.integers(1, 8))
    if (pos - start + 1) % length == 0 or (chunk == 0 and rng.random() < 0.25):
      ends.append(pos)
  ends = np.array(ends + [PAD_END] * 5, np.int64)
  return seg, ends


def _visible(seg, ends, window):
  """(raw T x T, entries T x C) visibility from the definitions, pair by pair."""
  t = seg.shape[0]
  raw = np.zeros((t, t), bool)
  ent = np.zeros((t, ends.shape[0]), bool)
  for q in range(t):
    for s in range(max(0, q - window + 1), q + 1):
      raw[q, s] = all(seg[u] == seg[q] for u in range(s, q + 1))  # same contiguous run
    for c, e in enumerate(ends):
      ent[q, c] = e <= q and all(seg[u] == seg[q] for u in range(e, q + 1))
  return raw, ent


def _seen_in_full(segp, endsp, window, rows, cols, raw):
  """Every query of ``rows`` sees every key (raw) or entry of ``cols``, by the definition."""
  same = lambda a, b: all(segp[u] == segp[b] for u in range(a, b + 1))
  if raw:
    return all(s <= q and s > q - window and same(s, q) for q in rows for s in cols)
  return all(endsp[c] <= q and same(endsp[c], q) for q in rows for c in cols)


def _brute(kernel, seg, ends, window, x):
  """(executed tiles, needed tiles, missed, useful pairs, masked) replaying the GPU kernels'
  loops; masked: executed tiles some query of which does not see some key of the tile."""
  t = seg.shape[0]
  tile = max(x.bq, x.bk, x.bq_bwd, x.bk_bwd, x.program_rows)
  tp = -(-t // tile) * tile
  cmax = max(x.bc, x.bc_bwd)
  cp = -(-len(ends) // cmax) * cmax
  segp = list(seg) + [seg[-1]] * (tp - t)
  endsp = list(ends) + [PAD_END] * (cp - len(ends))
  doc_start = [next(u for u in range(q + 1) if all(segp[w] == segp[q] for w in range(u, q + 1)))
               for q in range(tp)]
  doc_end = [next(u for u in range(q + 1, tp + 1) if u == tp or segp[u] != segp[q])
             for q in range(tp)]
  raw, ent = _visible(seg, np.array([e for e in endsp]), window)
  executed, needed_set = set(), set()
  if kernel == "gpu_fwd":
    for i in range(tp // x.bq):
      rows = range(i * x.bq, i * x.bq + x.bq)
      if window:
        lo = min(max(q - window + 1, doc_start[q]) for q in rows) // x.bk
        executed |= {("raw", i, j) for j in range(lo, -(-(i * x.bq + x.bq) // x.bk))}
      elo = [sum(e < doc_start[q] for e in endsp) for q in rows]
      ehi = [max(sum(e <= q for e in endsp), lo_) for q, lo_ in zip(rows, elo, strict=True)]
      executed |= {("ent", i, j) for j in range(min(elo) // x.bc, -(-max(ehi) // x.bc))}
    for q in range(t):
      needed_set |= {("raw", q // x.bq, s // x.bk) for s in range(t) if raw[q, s]}
      needed_set |= {("ent", q // x.bq, c // x.bc) for c in range(cp) if ent[q, c]}
  elif kernel == "gpu_dkv_raw":
    for j in range(tp // x.bk_bwd if window else 0):  # no raw keys: the kernel is not called
      keys = range(j * x.bk_bwd, j * x.bk_bwd + x.bk_bwd)
      hi = max(min(s + window, doc_end[s]) for s in keys)
      executed |= {(j, i) for i in range(j * x.bk_bwd // x.bq_bwd, -(-hi // x.bq_bwd))}
    for q in range(t):
      needed_set |= {(s // x.bk_bwd, q // x.bq_bwd) for s in range(t) if raw[q, s]}
  else:  # gpu_dkv_entries
    for j in range(cp // x.bc_bwd):  # the query blocks of the entries some query sees
      cs = [c for c in range(j * x.bc_bwd, j * x.bc_bwd + x.bc_bwd) if endsp[c] < tp]
      if cs:
        lo = min(endsp[c] for c in cs) // x.bq_bwd
        hi = max(doc_end[endsp[c]] for c in cs)
        executed |= {(j, i) for i in range(lo, -(-hi // x.bq_bwd))}
    for q in range(t):
      needed_set |= {(c // x.bc_bwd, q // x.bq_bwd) for c in range(cp) if ent[q, c]}
  useful = int(ent.sum()) if kernel == "gpu_dkv_entries" else int(raw.sum())
  if kernel == "gpu_fwd":
    useful = int(raw.sum() + ent.sum())
    size = {"raw": x.bk, "ent": x.bc}
    masked = sum(not _seen_in_full(segp, endsp, window, range(i * x.bq, i * x.bq + x.bq),
                                   range(j * size[src], j * size[src] + size[src]), src == "raw")
                 for src, i, j in executed)
  else:  # key-major tiles (key or entry block j, query block i)
    size = x.bk_bwd if kernel == "gpu_dkv_raw" else x.bc_bwd
    masked = sum(not _seen_in_full(segp, endsp, window, range(i * x.bq_bwd, (i + 1) * x.bq_bwd),
                                   range(j * size, (j + 1) * size), kernel == "gpu_dkv_raw")
                 for j, i in executed)
  return len(executed), len(needed_set), len(needed_set - executed), useful, masked


CASES = [(40, 0, 1, 4, 8), (53, 1, 3, 4, 16), (64, 2, 2, 0, 5), (37, 3, 4, 0, 0), (48, 4, 1, 3, 48)]


@pytest.mark.parametrize("kernel", ["gpu_fwd", "gpu_dkv_raw", "gpu_dkv_entries"])
@pytest.mark.parametrize("t,seed,docs,chunk,window", CASES)
def test_counts_equal_a_brute_force_replay(kernel, t, seed, docs, chunk, window):
  seg, ends = _layout(t, seed, docs, chunk)
  # The GPU kernels tile entries as raw keys (one column axis): bc = bk, bc_bwd = bk_bwd.
  x = tiles_lib.Tiles(bq=16, bk=8, bc=8, bq_bwd=8, bk_bwd=16, bc_bwd=16)
  got = tiles_lib.count(kernel, seg, ends, window, x)
  executed, needed, missed, useful, masked = _brute(kernel, seg, ends, window, x)
  assert (got.executed, got.needed, got.missed, got.useful_pairs, got.masked) == (
      executed, needed, missed, useful, masked)
  assert got.missed == 0  # no kernel skips a tile that holds a visible score
  if kernel == "gpu_dkv_raw" and window == 0:
    assert got.executed == 0


@pytest.mark.parametrize("t,seed,docs,chunk,window", CASES)
def test_mosaic_forward_counts_its_64_row_tiles_and_walks_each_programs_union(
    t, seed, docs, chunk, window):
  # Its tiles are the Triton forward's at 64 x bk (one key block size for both sources); a
  # program of two warpgroups walks the union of its two tiles' block ranges.
  seg, ends = _layout(t, seed, docs, chunk)
  x = tiles_lib.Tiles(bq=64, bk=64, bc=64, bq_bwd=16, bk_bwd=16, bc_bwd=16, bq_fwd=64,
                      program_rows=128)
  got = tiles_lib.count("mgpu_fwd", seg, ends, window, x)
  triton = tiles_lib.count("gpu_fwd", seg, ends, window, x)
  assert (got.executed, got.needed, got.missed, got.masked) == (
      triton.executed, triton.needed, 0, triton.masked)
  executed, needed, missed, _, masked = _brute("gpu_fwd", seg, ends, window, x)
  assert (got.executed, got.needed, got.masked) == (executed, needed, masked)
  # Brute-force union: steps of program p = blocks from its first tile's lo to its last's hi.
  tp, cp = 128 * -(-t // 128), 64 * -(-len(ends) // 64)
  segp = np.r_[seg, np.full(tp - t, seg[-1])]
  endsp = np.r_[ends, np.full(cp - len(ends), PAD_END)]
  starts = [max(u for u in range(q + 1) if u == 0 or segp[u] != segp[u - 1]) for q in range(tp)]
  elo = lambda q: int(np.sum(endsp < starts[q]))
  ehi = lambda q: max(int(np.sum(endsp <= q)), elo(q))
  steps = 0
  for p in range(tp // 128):
    first, last = range(p * 128, p * 128 + 64), range(p * 128 + 64, p * 128 + 128)
    if window:
      steps += max(-(-(p * 128 + 128) // 64) - min(max(q - window + 1, starts[q])
                                                    for q in first) // 64, 0)
    steps += max(-(-max(ehi(q) for q in last) // 64) - min(elo(q) for q in first) // 64, 0)
  assert got.grid_steps == steps


def test_a_hand_counted_window():
  """T = 256, one document, W = 64, 64 x 64 tiles, no entries: query block i runs key blocks
  i-1 and i (block 0: one), 7 tiles, all needed; 64 x 64 + ... pairs."""
  x = tiles_lib.Tiles(64, 64, 16, 64, 64, 16)
  got = tiles_lib.count("gpu_fwd", np.zeros(256, np.int64), np.full(16, PAD_END), 64, x)
  assert (got.executed, got.needed, got.missed) == (7, 7, 0)
  assert got.useful_pairs == sum(min(q + 1, 64) for q in range(256))
  assert got.executed_pairs == 7 * 64 * 64


def test_tpu_grid_walks_the_static_worst_case():
  seg, ends = _layout(64, 0, 1, 4)
  x = tiles_lib.Tiles(8, 8, 8, 8, 8, 8)
  fwd = tiles_lib.count("tpu_fwd", seg, ends, 8, x)
  gpu = tiles_lib.count("gpu_fwd", seg, ends, 8, x)
  assert fwd.executed == gpu.executed and fwd.missed == 0
  assert 0 < fwd.masked == gpu.masked < fwd.executed  # the same interior tiles run unmasked
  # 8 query blocks x (raw steps min(8, ceil(15 / 8) + 1) = 3, plus every entry block: 16
  # entries and 5 padding ones, padded to 24 = 3 blocks), whatever the ranges
  assert fwd.grid_steps == 8 * (3 + 3)


def test_committed_table_is_todays_count_and_within_the_goal():
  """bench/results/kernel_tiles.json holds what the counter gives today (its T = 4096 rows,
  recomputed), every kernel within 10% of the needed tiles and none missing one."""
  import json
  import pathlib

  from bench import kernel_tiles

  path = pathlib.Path(__file__).resolve().parents[1] / "bench/results/kernel_tiles.json"
  committed = json.loads(path.read_text())["rows"]
  today = kernel_tiles.rows([4096])
  assert [r for r in committed if r["T"] == 4096] == today
  assert all(r["within_goal"] and r["missed"] == 0 for r in committed)
