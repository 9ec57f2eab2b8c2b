"""The lookup layout options (``LookupSpec.filler_kinds`` and ``query``, data fields
``lookup_filler_kinds`` and ``lookup_query``): the kv rows' varied filler and query marker in
the lookup's prompts and training rows, with the records, demonstrations and answers intact."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from chunkformer.config import ConfigError, DataConfig
from chunkformer.data import kv, lookup_rows, lookup_shortcuts, lookup_task

QUERY = 2
SPEC = lookup_task.LookupSpec(seq_len=96, keys=tuple(range(10, 26)), values=tuple(range(30, 46)),
                              filler=3, bos=1, num_records=8, num_demos=3, modulus=8,
                              prompts_per_residue=64, filler_kinds=4, query=QUERY)


@pytest.mark.parametrize("padding", lookup_task.PADDINGS)
def test_each_demonstration_and_the_target_follow_a_query_token_amid_varied_filler(padding):
  spec = dataclasses.replace(SPEC, padding=padding)
  prompts = lookup_task.generate(spec, 5)
  demo_keys = spec.demo_key_positions
  np.testing.assert_array_equal(demo_keys, spec.seq_len - 2 - 3 * np.arange(3, 0, -1) + 1)
  fillers = set(SPEC.fillers)
  assert fillers == set(range(3, 7))
  seen = set()
  for row, at, answer in zip(prompts.tokens, prompts.record_positions, prompts.answers[:, 0],
                             strict=True):
    lookup = dict(zip(row[at], row[at + 1], strict=True))
    assert all(lookup[k] == v for k, v in zip(row[demo_keys], row[demo_keys + 1], strict=True))
    assert np.all(row[demo_keys - 1] == QUERY) and row[spec.seq_len - 2] == QUERY
    assert lookup[row[spec.seq_len - 1]] == answer
    other = np.ones(spec.seq_len, bool)
    other[np.concatenate([[0], at, at + 1, np.arange(spec.region_end + 1, spec.seq_len)])] = False
    assert set(row[other]) <= fillers and row[spec.region_end] in fillers
    seen |= set(row[other])
  assert seen == fillers  # every filler token is drawn
  assert QUERY not in prompts.tokens[:, :spec.region_end]


def test_the_shortcut_baselines_read_the_demonstrations_where_the_query_puts_them():
  spec = dataclasses.replace(SPEC, num_records=16, num_demos=14, seq_len=128,
                             prompts_per_residue=64)
  plain = dataclasses.replace(spec, filler_kinds=1, query=None)
  for layout in (spec, plain):  # the target is one of 2 undemonstrated records either way
    found = lookup_shortcuts.baselines(layout, lookup_task.generate(layout, 3))
    assert found.mean("undemonstrated") == pytest.approx(0.5 + 0.5 / 16, abs=0.03)


def test_the_committed_layout_is_unchanged_by_the_options_defaults():
  plain = dataclasses.replace(SPEC, filler_kinds=1, query=None)
  assert plain.region_end == plain.seq_len - 2 - 2 * plain.num_demos
  prompts = lookup_task.generate(plain, 5)
  assert set(np.unique(prompts.tokens)) <= {1, 3} | set(plain.keys) | set(plain.values)


def test_a_query_or_filler_token_that_collides_is_refused_naming_the_field():
  with pytest.raises(ValueError, match="query: token 4 is one of the filler tokens"):
    dataclasses.replace(SPEC, query=4).validate()
  with pytest.raises(ValueError, match="keys: key, value, filler, query and BOS"):
    dataclasses.replace(SPEC, filler_kinds=8).validate()  # fillers 3..10 reach the keys


def test_training_rows_carry_the_layout_and_score_each_demonstration_and_the_answer():
  config = DataConfig(task="lookup", seq_len=64, num_pairs=8, lookup_demos=4, num_symbols=16,
                      lookup_values="distinct", lookup_filler_kinds=4, lookup_query=True)
  lookup_rows.check(config)
  row = lookup_rows.make_row(np.random.default_rng(0), config)
  layout = lookup_rows.spec(config)
  scored = np.flatnonzero(row["loss_mask"])
  np.testing.assert_array_equal(scored, np.append(layout.demo_key_positions, 63))
  assert np.all(row["inputs"][scored - 1] == kv.QUERY)
  with pytest.raises(ConfigError, match="data.lookup_filler_kinds': 5 filler tokens"):
    lookup_rows.check(dataclasses.replace(config, lookup_filler_kinds=5))
