"""The probe hook: predictions through prefill(eviction=...) + decoding, and the registered
``eviction_needles`` probe's accuracy by position per policy on a tiny model."""

import types

import jax.numpy as jnp
import numpy as np
import pytest

from chunkformer import eviction
from chunkformer.config import ConfigError
from chunkformer.evaluation.probes import evicting
from chunkformer.evaluation.probes.base import ProbeContext
from chunkformer.evaluation.probes.registry import PROBES, check
from chunkformer.eviction import StreamingLLM, from_dict
from chunkformer.studies.eviction.probes import eviction_needles
from tests import policy_sweeps
from tests.eviction_reference import keep_masks, masked_forward_jit


@pytest.fixture(scope="module")
def trained():
  return policy_sweeps.smoke_model()  # 2 full layers, T = 32


def _rows(trained):
  return policy_sweeps.far_rows(trained, 6)


def test_evicting_predictor_predicts_as_the_forward_pass_with_evicted_keys_masked(trained):
  rows = _rows(trained)
  prompt = int(rows.answer_start_N[0])
  policy = StreamingLLM(budget=8, sinks=2)
  got = evicting.EvictingPredictor(trained, 12, policy, prompt)(rows.rows)["predictions"]
  inputs = rows.rows["inputs"]
  n, t = inputs.shape
  kept = np.broadcast_to(np.r_[0, 1, prompt - 6:prompt], (2, n, 2, 8))  # layers, rows, kv heads
  masks = keep_masks(kept, trained.config.model.num_heads, prompt, t)
  logits = masked_forward_jit(trained.runtime.model, trained.params, jnp.asarray(inputs),
                              jnp.asarray(masks))
  np.testing.assert_array_equal(got, np.argmax(np.asarray(logits), axis=-1))
  with pytest.raises(ValueError, match="segment_ids"):
    evicting.EvictingPredictor(trained, 8, policy, prompt)(
        dict(rows.rows, segment_ids=np.ones_like(inputs)))
  with pytest.raises(ConfigError, match="'eviction.streaming_llm.budget'"):
    evicting.EvictingPredictor(trained, 8, StreamingLLM(budget=40), prompt)


def test_probe_records_accuracy_by_offset_and_phase_for_each_policy(trained):
  # the predictor test's policy and batch (its compiled program is reused)
  policies = [dict(policy="streaming_llm", budget=8, sinks=2)]
  options = dict(policies=policies, num_offsets=6, num_haystacks=2, batch_size=12,
                 phase_sizes=(4,))
  check({"eviction_needles": options})
  context = ProbeContext(trained, None, "unit", (3,))
  result = PROBES["eviction_needles"](context, **options)
  assert list(result.record) == ["streaming_llm-b8-sinks2"]
  record = result.record["streaming_llm-b8-sinks2"]
  prompt = int(_rows(trained).answer_start_N[0])
  assert record["prompt_tokens"] == [prompt] and record["budget_tokens"] == [8]
  assert record["policy"] == policies[0]
  matrix = result.matrices["streaming_llm-b8-sinks2_far"]
  assert matrix.correct_YxJ.shape == (2, 6)
  far = record["depths"]["far"]
  assert far["matrix"] == "streaming_llm-b8-sinks2_far"  # the key the claims read
  np.testing.assert_allclose(far["accuracy_by_offset"], matrix.correct_YxJ.mean(axis=0))
  for size in (3, 4):  # the unit's chunk size and the option's
    phase = matrix.offsets_J % size
    expected = [matrix.correct_YxJ[:, phase == p].mean() for p in range(size)]
    np.testing.assert_allclose(far["accuracy_by_phase"][str(size)], expected)
  with pytest.raises(ConfigError, match=r"'sweep.probes.eviction_needles.policies\[0\].policy'"):
    PROBES["eviction_needles"](context, policies=[dict(policy="nope", budget=4)])
  with pytest.raises(ConfigError, match="listed twice"):
    PROBES["eviction_needles"](context, policies=policies * 2)
  with pytest.raises(ConfigError, match="'eviction.snapkv.budget'"):
    PROBES["eviction_needles"](context, policies=[dict(policy="snapkv", budget=64, window=4)],
                               num_offsets=6, num_haystacks=2)


def test_delimiter_ids_follow_a_loaded_models_token_map():
  mapping = types.SimpleNamespace(to_model=np.arange(30) + 100)  # kv id i is model id 100 + i
  policy = from_dict(dict(policy="content_chunkkv", budget=8, window=2, delimiters=[3, 5]))
  mapped = eviction_needles.in_model_tokens(policy, mapping)
  assert mapped.boundaries.ids == (103, 105) and mapped.window == 2
  assert eviction_needles.in_model_tokens(policy, None) is policy
  grid = from_dict(dict(policy="chunkkv", budget=8, window=2, chunk=10))
  assert eviction_needles.phase_sizes_for(grid, (4,), (8, 4)) == [4, 8, 10]
  assert eviction_needles.phase_sizes_for(policy, (4,), ()) == [4]
  # a stored matrix name holds no '.': a share of the prompt or several delimiter ids
  assert eviction_needles.matrix_key(eviction.label(policy), "far").endswith("delim3p5-len1-64_far")
  assert eviction_needles.matrix_key("snapkv-b0.25-window8", "far") == "snapkv-b0p25-window8_far"


def test_a_sweep_config_with_a_bad_policy_is_refused_before_anything_trains():
  good = dict(policies=[dict(policy="snapkv", budget=32)])
  check({"eviction_needles": good})
  with pytest.raises(ConfigError, match=r"eviction_needles\.policies"):
    check({"eviction_needles": dict(policies=[])})
  with pytest.raises(ConfigError, match=r"eviction_needles\.prompt_end"):
    check({"eviction_needles": dict(good, prompt_end="middle")})
  with pytest.raises(ConfigError, match=r"eviction_needles\.policies\[0\]"):
    check({"eviction_needles": dict(policies=[dict(policy="nope", budget=8)])})
