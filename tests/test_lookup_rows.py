"""Task "lookup": training rows made of the paper's lookup prompts (data/lookup_rows.py)."""

import numpy as np
import pytest

from chunkformer import data
from chunkformer.config_sections.data import DataConfig
from chunkformer.config_sections.errors import ConfigError
from chunkformer.data import kv, lookup_rows, lookup_task

CONFIG = DataConfig(task="lookup", seq_len=96, num_pairs=16, num_symbols=40, lookup_demos=4,
                    batch_size=64)


def _record_region(config):
  return lookup_rows.spec(config).region_end


def test_every_scored_target_is_the_value_after_its_key_in_the_records():
  batch = data.make_batch(CONFIG, seed=3, step=7, split="train")
  end = _record_region(CONFIG)
  rows = zip(batch["inputs"], batch["targets"], batch["loss_mask"], strict=True)
  for inputs, targets, mask in rows:
    scored = np.nonzero(mask)[0]
    assert len(scored) == CONFIG.lookup_demos + 1 and scored[-1] == CONFIG.seq_len - 1
    for i in scored:
      at = np.nonzero(inputs[1:end] == inputs[i])[0] + 1
      assert len(at) == 1  # keys are distinct within a row
      assert targets[i] == inputs[at[0] + 1]


def test_rows_use_the_kv_vocabulary_and_the_batch_contract():
  batch = data.make_batch(CONFIG, seed=0, step=0, split="heldout")
  tokens = lookup_task.default_tokens(CONFIG)
  assert set(np.unique(batch["inputs"])) <= ({kv.BOS, kv.FILLER_BASE} | set(tokens["keys"])
                                             | set(tokens["values"]))
  assert (batch["inputs"][:, 0] == kv.BOS).all()
  assert data.vocab_size_needed(CONFIG) == kv.vocab_size(CONFIG)
  np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
  np.testing.assert_array_equal(batch["positions"][0], np.arange(CONFIG.seq_len))


def test_mixed_padding_draws_both_modes_and_target_phases_spread():
  batch = data.make_batch(CONFIG, seed=1, step=0, split="train")
  keys = set(lookup_task.default_tokens(CONFIG)["keys"])
  end = _record_region(CONFIG)
  contiguous, phases = [], []
  for inputs in batch["inputs"]:
    at = np.array([p for p in range(1, end) if inputs[p] in keys])
    contiguous.append(bool(np.all(np.diff(at) == 2)))  # prefix padding: one block of records
    phases.append(np.nonzero(inputs[1:end] == inputs[-1])[0][0] % 4)
  assert 0 < sum(contiguous) < len(contiguous)
  assert set(phases) == {0, 1, 2, 3}


def test_rows_are_a_pure_function_of_seed_step_and_row():
  a = data.make_batch(CONFIG, seed=5, step=2, split="train")
  b = data.make_batch(CONFIG, seed=5, step=2, split="train")
  c = data.make_batch(CONFIG, seed=5, step=3, split="train")
  np.testing.assert_array_equal(a["inputs"], b["inputs"])
  assert not np.array_equal(a["inputs"], c["inputs"])


@pytest.mark.parametrize("change, field", [
    (dict(num_symbols=20), "data.num_symbols"),
    (dict(seq_len=40), "data.seq_len"),
    (dict(lookup_demos=16), "data.lookup_demos"),
    (dict(lookup_padding="gaps"), "data.lookup_padding"),
])
def test_bad_layouts_are_refused_naming_the_field(change, field):
  config = DataConfig(**{**CONFIG.__dict__, **change})
  with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
    data.check_config(config)
