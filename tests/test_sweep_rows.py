"""In-distribution needle sweep rows: as many queries as training rows, the moved needle first."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from chunkformer.config import DataConfig
from chunkformer.data import kv
from chunkformer.evaluation.probes import needle_sweep

KV = DataConfig(seq_len=96, num_pairs=6, key_len=2, value_len=2, num_queries=3,
                num_symbols=16, near_distance=30)
SPEC = needle_sweep.NeedleSweepSpec(num_offsets=12, num_haystacks=4, depths=(0.0, 1.0),
                                    align=4, seed=7)


def test_with_first_query_moves_or_inserts_the_needle_first():
  layout = kv.sample_layout(np.random.default_rng(0), KV)
  asked = kv.with_queries(layout, (3, 0, 5))
  assert kv.with_first_query(asked, 0).queries == (0, 3, 5)
  assert kv.with_first_query(kv.with_queries(layout, (3, 4, 5)), 0).queries == (0, 3, 4)


@pytest.mark.parametrize("depth_index", [0, 1])
def test_sweep_rows_ask_num_queries_with_the_moved_needle_first(depth_index):
  rows = needle_sweep.build(KV, SPEC)[depth_index]
  num_haystacks, num_offsets = rows.shape
  inputs = np.concatenate([rows.rows["inputs"], rows.rows["targets"][:, -1:]], axis=1)
  block = kv.query_len(KV)
  start = kv.query_start(KV)
  for n, layout in enumerate(rows.layouts):
    assert len(layout.queries) == KV.num_queries
    assert layout.queries[0] == 0  # the moved needle
    assert layout.offsets[0] == rows.offsets_J[n % num_offsets]
    markers = np.flatnonzero(inputs[n] == kv.QUERY)
    np.testing.assert_array_equal(markers, start + block * np.arange(KV.num_queries))
    # The scored span is the first block's answer: the moved needle's value tokens.
    span = slice(rows.answer_start_N[n], rows.answer_stop_N[n])
    np.testing.assert_array_equal(rows.rows["targets"][n, span], layout.values[0])
    assert rows.answer_start_N[n] == start + KV.key_len
    # Every query is scored in the training loss mask, as in a training row.
    assert rows.rows["loss_mask"][n].sum() == KV.num_queries * KV.value_len
  # One haystack asks the same needles in every row; haystacks differ.
  queries = np.array([layout.queries for layout in rows.layouts]).reshape(
      num_haystacks, num_offsets, -1)
  assert (queries == queries[:, :1]).all()
  assert len({tuple(q) for q in queries[:, 0]}) > 1
  again = needle_sweep.build(KV, SPEC)[depth_index]
  for key, value in rows.rows.items():
    np.testing.assert_array_equal(value, again.rows[key])


def test_one_query_rows_are_the_earlier_one_query_rows():
  config = dataclasses.replace(KV, num_queries=1)
  rows = needle_sweep.build(config, SPEC)[0]
  start, stop = needle_sweep.window(config, SPEC, 0.0)
  for haystack in range(SPEC.num_haystacks):
    # The construction before in-distribution rows: one query asking needle 0.
    rng = np.random.default_rng(np.random.SeedSequence([SPEC.seed, 0, haystack]))
    base = kv.with_queries(kv.sample_layout(rng, config, reserved=(start, stop),
                                            num_queries=1), (0,))
    n = haystack * SPEC.num_offsets
    assert rows.layouts[n] == kv.with_pair_at(base, 0, int(rows.offsets_J[0]))
