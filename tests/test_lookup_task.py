"""The position-matched lookup and long needle generators: matched target positions, a fixed
query, the right answers, and in-sequence padding that unlocks distractor phases."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from chunkformer.data import long_needle, lookup_task, matched_positions

LOOKUP = lookup_task.LookupSpec(seq_len=96, keys=tuple(range(10, 26)), values=tuple(range(30, 46)),
                                filler=3, bos=1, num_records=8, num_demos=2, modulus=8,
                                prompts_per_residue=64)
NEEDLE = long_needle.NeedleSpec(seq_len=300, keys=tuple(range(10, 16)), values=tuple(range(30, 40)),
                                filler=3, bos=1, key_len=2, value_len=2, modulus=8,
                                prompts_per_residue=64)


def _by_residue(prompts, values):
  return np.asarray(values, np.float64).reshape(prompts.modulus, -1)


@pytest.mark.parametrize("modulus, step", [(2, 4), (4, 16), (8, 64), (24, 576)])
def test_group_sizes_that_can_match_exactly(modulus, step):
  assert matched_positions.smallest_group(modulus) == step
  with pytest.raises(ValueError, match=f"prompts_per_residue: .* use a multiple of {step}"):
    matched_positions.check_group_size(modulus, step + modulus, "prompts_per_residue")


# (4, 1, 78), (4, 0, 85): ranges where the sum of squares needs +2 with no two positions in
# one bin (reached only by passing the target and coming back)
@pytest.mark.parametrize("modulus, lo, hi", [(4, 5, 40), (8, 0, 200), (24, 3, 400), (4, 1, 78),
                                             (4, 0, 85)])
def test_matched_positions_have_equal_mean_and_variance(modulus, lo, hi):
  p = matched_positions.matched_positions(modulus, matched_positions.smallest_group(modulus),
                                          lo, hi)
  np.testing.assert_array_equal(p % modulus, np.arange(modulus)[:, None] + 0 * p)
  assert p.min() >= lo and p.max() <= hi
  assert np.ptp(p.sum(axis=1)) == 0 and np.ptp((p**2).sum(axis=1)) == 0  # exact integers
  assert np.ptp(p.mean(axis=1)) == 0.0 and np.ptp(p.var(axis=1)) == 0.0


@pytest.mark.parametrize("padding", lookup_task.PADDINGS)
def test_lookup_prompts_are_matched_and_answer_the_target(padding):
  spec = dataclasses.replace(LOOKUP, padding=padding)
  prompts = lookup_task.generate(spec, seed=0)
  n = spec.modulus * spec.prompts_per_residue
  assert prompts.tokens.shape == (n, spec.seq_len) and prompts.answer_positions == (95,)
  residues = _by_residue(prompts, prompts.residues)
  np.testing.assert_array_equal(residues, np.arange(spec.modulus)[:, None] + 0 * residues)
  t_k = _by_residue(prompts, prompts.target_positions)
  assert np.ptp(t_k.mean(axis=1)) == 0.0 and np.ptp(t_k.var(axis=1)) == 0.0
  rows = np.arange(n)
  tokens = prompts.tokens
  # the query (last token) is the target key, the answer the token after it in the records
  np.testing.assert_array_equal(tokens[:, 95], tokens[rows, prompts.target_positions])
  np.testing.assert_array_equal(prompts.answers[:, 0], tokens[rows, prompts.target_positions + 1])
  for p in range(0, n, 37):  # keys distinct; each key followed by a value; demos are records
    at = prompts.record_positions[p]
    keys = tokens[p, at]
    assert len(set(keys)) == spec.num_records and set(keys) <= set(spec.keys)
    assert set(tokens[p, at + 1]) <= set(spec.values)
    assert np.all(np.diff(at) >= 2) and at[-1] + 1 < spec.region_end
    lookup = dict(zip(keys, tokens[p, at + 1], strict=True))
    demo = tokens[p, spec.region_end + 1:95]
    assert tokens[p, spec.region_end] == spec.filler and tokens[p, 0] == spec.bos
    assert all(lookup[k] == v for k, v in zip(demo[::2], demo[1::2], strict=True))
    assert tokens[p, 95] not in demo[::2]
    filler = np.ones(spec.seq_len, bool)
    filler[np.concatenate([[0], at, at + 1, np.arange(spec.region_end + 1, 96)])] = False
    assert np.all(tokens[p, filler] == spec.filler)
  perfect = np.zeros_like(tokens)
  perfect[:, 95] = prompts.answers[:, 0]
  assert prompts.correct(perfect).all() and not prompts.correct(0 * perfect).any()


def test_in_sequence_padding_decorrelates_distractor_phases():
  locking = {padding: lookup_task.lockstep(lookup_task.generate(
      dataclasses.replace(LOOKUP, padding=padding), seed=1)) for padding in lookup_task.PADDINGS}
  # prefix: every distractor sits at a fixed distance from the target, its phase locked to the
  # target's; in-sequence: the gaps vary, the phase differences spread over the 8 phases
  assert locking["prefix"] == pytest.approx(1.0)
  assert locking["in_sequence"] < 0.2


def test_phase_locking_by_hand():
  t = np.arange(8)
  assert lookup_task.phase_locking(t, t + 3, 8) == pytest.approx(1.0)
  assert lookup_task.phase_locking(np.zeros(8), t, 8) == pytest.approx(0.0, abs=1e-12)


def test_lookup_spec_errors_name_the_field():
  with pytest.raises(ValueError, match="padding: 'middle'"):
    lookup_task.generate(dataclasses.replace(LOOKUP, padding="middle"), 0)
  with pytest.raises(ValueError, match="seq_len: 30 tokens"):
    lookup_task.generate(dataclasses.replace(LOOKUP, seq_len=30), 0)
  with pytest.raises(ValueError, match="keys: 16 distinct"):
    lookup_task.generate(dataclasses.replace(LOOKUP, num_records=20, seq_len=200), 0)
  with pytest.raises(ValueError, match="prompts_per_residue: 8 prompts"):
    lookup_task.generate(dataclasses.replace(LOOKUP, prompts_per_residue=8), 0)


def test_long_needle_prompts_are_matched_with_a_fixed_query():
  prompts = long_needle.generate(NEEDLE, seed=0)
  t_k = _by_residue(prompts, prompts.target_positions)
  assert np.ptp(t_k.mean(axis=1)) == 0.0 and np.ptp(t_k.var(axis=1)) == 0.0
  lo, hi = NEEDLE.window()
  assert lo <= t_k.min() and t_k.max() <= hi and abs(t_k.mean() - 148) <= 1  # the middle
  qs = NEEDLE.query_start
  assert qs == 297 and prompts.answer_positions == (298, 299)
  rows = np.arange(prompts.tokens.shape[0])
  tok = prompts.tokens
  for i in range(2):  # the query repeats the target key; the answers are its value tokens
    np.testing.assert_array_equal(tok[:, qs + i], tok[rows, prompts.target_positions + i])
    np.testing.assert_array_equal(prompts.answers[:, i],
                                  tok[rows, prompts.target_positions + 2 + i])
  np.testing.assert_array_equal(tok[:, 299], prompts.answers[:, 0])  # teacher forced
  for p in range(0, rows.size, 53):  # records back to back; no other record has the key
    first = 1 + (prompts.target_positions[p] - 1) % 4
    assert np.all(tok[p, 1:first] == NEEDLE.filler)
    count = (qs - 1 - first) // 4
    records = tok[p, first:first + 4 * count].reshape(count, 4)
    assert set(records[:, :2].ravel()) <= set(NEEDLE.keys)
    matches = np.all(records[:, :2] == tok[p, qs:qs + 2], axis=1)
    assert matches.sum() == 1 and first + 4 * np.argmax(matches) == prompts.target_positions[p]


def test_long_needle_runs_at_other_lengths_and_refuses_too_short():
  long = long_needle.generate(dataclasses.replace(NEEDLE, seq_len=700, spread=40,
                                                  prompts_per_residue=64), seed=2)
  assert long.tokens.shape == (512, 700)
  with pytest.raises(ValueError, match="seq_len: 40 tokens"):
    long_needle.generate(dataclasses.replace(NEEDLE, seq_len=40), 0)
