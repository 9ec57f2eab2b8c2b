"""Target positions matched in distribution (one multiset shifted per residue) and in-sequence
padding whose neighbour phases do not follow the target's, at the paper protocol's size."""

import dataclasses

import numpy as np
import pytest

from chunkformer.data import lookup_task, matched_positions

# The paper protocol's lookup rows (configs/sweeps/paper_protocol.py): 128 tokens, 16 records,
# 8 demonstrations, residues mod 24, 576 prompts per residue.
SPEC = lookup_task.LookupSpec(seq_len=128, keys=tuple(range(10, 42)),
                              values=tuple(range(50, 82)), filler=2, bos=1, num_records=16,
                              num_demos=8, modulus=24, prompts_per_residue=576)
COUPLING_MAX = 0.05  # Cramer's V of target phase x neighbour phase, every stride


@pytest.mark.parametrize("modulus, per_residue, lo, hi", [(24, 576, 1, 108), (8, 64, 0, 200),
                                                          (4, 10, 3, 40)])
def test_shifted_positions_are_one_multiset_shifted_by_the_residue(modulus, per_residue, lo,
                                                                   hi):
  p = matched_positions.shifted_positions(modulus, per_residue, lo, hi)
  assert p.shape == (modulus, per_residue) and p.min() >= lo and p.max() <= hi
  np.testing.assert_array_equal(p % modulus, np.arange(modulus)[:, None] + 0 * p)
  base = np.sort(p - np.arange(modulus)[:, None], axis=1)
  np.testing.assert_array_equal(base, np.broadcast_to(base[0], base.shape))
  centred = p - p.mean(axis=1, keepdims=True)
  for k in (2, 3, 4):  # every central moment equal, not only the variance
    np.testing.assert_allclose((centred**k).mean(axis=1), (centred[0]**k).mean())


def test_generator_with_shifted_positions_places_targets_there():
  spec = dataclasses.replace(SPEC, positions="shift", padding="in_sequence_decorrelated")
  prompts = lookup_task.generate(spec, 0)
  by_residue = prompts.target_positions.reshape(24, -1)
  np.testing.assert_array_equal(by_residue, matched_positions.shifted_positions(24, 576, 1, 108))
  rows = np.arange(prompts.tokens.shape[0])
  np.testing.assert_array_equal(prompts.tokens[rows, prompts.target_positions],
                                prompts.tokens[:, -1])  # the queried key sits at t_K


@pytest.mark.parametrize("padding, low, high", [("prefix", 0.99, 1.0),
                                                ("in_sequence", 0.15, 0.35),
                                                ("in_sequence_decorrelated", 0.0, COUPLING_MAX)])
def test_neighbour_phase_coupling_by_padding(padding, low, high):
  prompts = lookup_task.generate(dataclasses.replace(SPEC, padding=padding), 2609)
  for stride in (4, 6, 8, 12):
    for step in (1, -1):
      v = lookup_task.neighbour_coupling(prompts, stride, step)
      assert low <= v <= high, (padding, stride, step, v)


def test_decorrelated_padding_keeps_records_in_order_inside_the_region():
  prompts = lookup_task.generate(dataclasses.replace(SPEC, padding="in_sequence_decorrelated"),
                                 1)
  rec = prompts.record_positions
  assert np.all(np.diff(rec, axis=1) >= 2)  # a key and its value never overlap the next
  assert rec.min() >= SPEC.start and rec.max() + 1 < SPEC.region_end
  assert np.all(np.any(rec == prompts.target_positions[:, None], axis=1))
