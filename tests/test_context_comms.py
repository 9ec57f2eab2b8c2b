"""docs/context_parallel.md's communication table ("Every kind, forward and backward") against
the compiled HLO: one layer of each attention kind under context = 4, its forward pass and its
loss gradient (tests/context_comms_worker.py, one fresh process with 4 fake CPU devices).

Twelve optimised compiles: minutes on 2 CPU cores, so the table's check runs with
CHUNKFORMER_SLOW_TESTS=1; the suite checks the HLO reader on a hand-written module."""

import json
import os
from collections import Counter

import pytest

from tests import context_comms_worker as worker
from tests import context_parallel_worker as cp
from tests import fake_devices

B, T, D, W, S = cp.BATCH, cp.HLO_SEQ_LEN, cp.HEAD_DIM, cp.WINDOW, cp.STRIDE
C = T // S  # entries of the fixed kinds
C_MAX = T // 3  # the dynamic kind's entry capacity: T / min_chunk (min_chunk = 3)
SHARDS = 4
E_SHARD = -(-(T // SHARDS) // 3)  # entries that can end in one shard: ceil(T_shard / min_chunk)
E = 32  # the smoke model's width
# Dimensions that grow with the row: T, the entries C, the windows' rows C W, the dynamic
# kind's capacity C_MAX.
GROWING = {T, C, C * W, C_MAX}
HALO = (B, 1, 1, W, D)
PIECES = (SHARDS, B, D)  # the dynamic kind's pieces of chunks across edges, one per shard
# The overlapping windows' halo: the previous shard's last chunk of S tokens, projected by the
# compressor's two maps (payload and gate: 2 D channels each).
CHUNK = (B, 1, S, 1, 2 * D)

# docs/context_parallel.md: floats per row moved by the collectives that grow with T
FLOATS_PER_ROW = {
    ("full", "forward"): 2 * T * D,
    ("full", "gradient"): 4 * T * D,
    ("fixed", "forward"): (2 * W + C) * D,
    ("fixed", "gradient"): 6_144,
    ("overlap", "forward"): 2 * W * D + 2 * S * 2 * D + C * D,
    ("overlap", "gradient"): 7_680,
    ("v4_indexer", "forward"): 2 * W * D + 4 * S * 2 * D + 2 * C * D,
    ("v4_indexer", "gradient"): 13_824,
    ("dynamic_router", "forward"): 2 * W * D + E + SHARDS * E_SHARD * D + 3 * SHARDS * D + C_MAX,
    ("dynamic_router", "gradient"): 8_224,
    ("dynamic_delimiter", "forward"): 2 * W * D + SHARDS * E_SHARD * D + 3 * SHARDS * D,
    ("dynamic_delimiter", "gradient"): 7_904,
}
# ... and the forward's float collectives, by (op, result shape)
FORWARD = {
    "full": {("all-gather", (B, T, 1, D)): 2},
    "fixed": {("collective-permute", HALO): 2, ("all-gather", (B, 1, C, D)): 1},
    "overlap": {("collective-permute", HALO): 2, ("collective-permute", CHUNK): 2,
                ("all-gather", (B, 1, C, D)): 1},
    # the main and the indexer's compressor: a chunk each for payload and gate; both entries
    "v4_indexer": {("collective-permute", HALO): 2, ("collective-permute", CHUNK): 4,
                   ("all-gather", (B, 1, C, D)): 1, ("all-gather", (B, C, D)): 1},
    "dynamic_router": {("collective-permute", HALO): 2, ("collective-permute", (B, 1, E)): 1,
                       ("all-gather", (B, SHARDS * E_SHARD, D)): 1, ("all-gather", PIECES): 3,
                       ("all-reduce", (B, C_MAX)): 1},
    "dynamic_delimiter": {("collective-permute", HALO): 2,
                          ("all-gather", (B, SHARDS * E_SHARD, D)): 1, ("all-gather", PIECES): 3},
}


def _growing(items):
  """The float collectives whose result grows with the row (all-reduces of weight gradients
  and per-row sums excluded)."""
  return [c for c in items if c["dtype"] == "f32"
          and (c["op"] != "all-reduce" or GROWING & set(c["shape"]))]


@pytest.fixture(scope="module")
def found(tmp_path_factory):
  out = tmp_path_factory.mktemp("context_comms") / "collectives.json"
  fake_devices.run([worker.__file__, "--out", out], devices=4, timeout=1800)
  with open(out) as f:
    return json.load(f)


slow = pytest.mark.skipif(os.environ.get("CHUNKFORMER_SLOW_TESTS") != "1",
                          reason="twelve optimised compiles; CHUNKFORMER_SLOW_TESTS=1 runs it")


@slow
@pytest.mark.parametrize("kind,step", sorted(FLOATS_PER_ROW))
def test_floats_moved_per_row_are_the_tables(found, kind, step):
  moved = sum(c["elements"] for c in _growing(found[kind][step])) // B
  assert moved == FLOATS_PER_ROW[kind, step]


@slow
@pytest.mark.parametrize("kind", sorted(FORWARD))
def test_forward_collectives_are_the_tables(found, kind):
  got = Counter((c["op"], tuple(c["shape"])) for c in _growing(found[kind]["forward"]))
  assert got == Counter(FORWARD[kind])


@slow
@pytest.mark.parametrize("kind", sorted(FORWARD))
def test_the_backward_all_reduces_the_weight_gradients_at_most_twice_the_parameters(found,
                                                                                   kind):
  rest = [c for c in found[kind]["gradient"] if c["dtype"] == "f32"
          and c["op"] == "all-reduce" and not GROWING & set(c["shape"])]
  assert found[kind]["params"] <= sum(c["elements"] for c in rest) <= 2 * found[kind]["params"]


def test_the_hlo_reader_splits_combined_collectives():
  """Arrays of a combined collective each count (tuples longer than five carry /*index=5*/
  comments); non-collective lines are ignored."""
  hlo = "\n".join([
      "  %ar = (f32[16]{0}, f32[3]{0}, f32[4]{0}, f32[5]{0}, f32[6]{0}, /*index=5*/f32[7,2]{1,0})"
      " all-reduce(f32[16]{0} %a, f32[3]{0} %b), channel_id=2, to_apply=%sum",
      "  %ag = f32[2,384,1,16]{3,2,1,0} all-gather(f32[2,96,1,16]{3,2,1,0} %x), dimensions={1}",
      "  %cp = s32[2,1]{1,0} collective-permute(s32[2,1]{1,0} %y), source_target_pairs={{0,1}}",
      "  %add = (f32[3]{0}, f32[3]{0}) tuple(f32[3]{0} %p, f32[3]{0} %q)",
  ])
  found = worker.collectives(hlo)
  assert [(c["op"], c["dtype"], c["shape"], c["combined"]) for c in found] == [
      ("all-reduce", "f32", [16], 6), ("all-reduce", "f32", [3], 6),
      ("all-reduce", "f32", [4], 6), ("all-reduce", "f32", [5], 6),
      ("all-reduce", "f32", [6], 6), ("all-reduce", "f32", [7, 2], 6),
      ("all-gather", "f32", [2, 384, 1, 16], 1), ("collective-permute", "s32", [2, 1], 1)]
  assert sum(c["elements"] for c in found) == 16 + 3 + 4 + 5 + 6 + 14 + 2 * 384 * 16 + 2
