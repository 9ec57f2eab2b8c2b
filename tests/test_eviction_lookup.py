"""The registered ``eviction_lookup`` probe: the position-matched tests under eviction on a tiny
random full-attention model. Keeping everything gives the plain test's outcomes; keeping only
BOS gives what a forward pass in which the decoded tokens cannot see the records gives; bad
options and other layer kinds are refused by name (or, with ``full_only``, skipped)."""

import types

import jax.numpy as jnp
import numpy as np
import pytest

from chunkformer import config as config_lib
from chunkformer import runtime as runtime_lib
from chunkformer.config import ConfigError
from chunkformer.data import long_needle, lookup_task
from chunkformer.evaluation.probes import evicting
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.probes.base import ProbeContext
from chunkformer.evaluation.probes.registry import PROBES, check
from chunkformer.evaluation.stats import residue_accuracy
from configs import smoke
from tests.eviction_reference import keep_masks, masked_forward_jit

# T = 32, one BOS, 2 records and 1 demonstration: the record region ends at 32 - 2 - 2 = 28
LOOKUP = dict(modulus=4, prompts_per_residue=16, num_records=2, num_demos=1,
              paddings=("prefix",), seed=5)
REGION_END = 28
KEEP_ALL = dict(policy="streaming_llm", budget=REGION_END, sinks=0)
BOS_ONLY = dict(policy="streaming_llm", budget=1, sinks=1)


@pytest.fixture(scope="module")
def context():
  config = config_lib.from_dict(smoke.get_config().to_dict())  # 2 full layers, T = 32, kv
  rt = runtime_lib.build(config)
  trained = trained_lib.TrainedModel("", config, rt, rt.fresh_state().params, 0)
  return ProbeContext(trained, trained_lib.Predictor(trained, 64), "unit", (4,))


def _masked_predictions(trained, tokens, kept_positions, prompt_len):
  """Greedy predictions of one forward pass in which every query at or after ``prompt_len``
  sees, of the prompt, only ``kept_positions`` (every layer and kv head)."""
  model = trained.config.model
  n, t = tokens.shape
  kept = np.broadcast_to(np.asarray(kept_positions),
                         (model.num_layers, n, model.num_kv_heads, len(kept_positions)))
  masks = keep_masks(kept, model.num_heads, prompt_len, t)
  logits = masked_forward_jit(trained.runtime.model, trained.params, jnp.asarray(tokens),
                              jnp.asarray(masks))
  return np.argmax(np.asarray(logits), axis=-1)


def test_lookup_keeping_everything_equals_the_test_and_keeping_bos_masks_the_records(
    context, monkeypatch):
  seen = []

  class Recording(evicting.EvictingPredictor):
    def __call__(self, rows):
      out = super().__call__(rows)
      seen.append((self.policy.budget, self.prompt_len, rows["inputs"], out["predictions"]))
      return out

  monkeypatch.setattr(evicting, "EvictingPredictor", Recording)
  options = dict(LOOKUP, policies=[KEEP_ALL, BOS_ONLY], batch_size=64)
  check({"eviction_lookup": options})
  result = PROBES["eviction_lookup"](context, **options)
  plain = PROBES["lookup"](context, **LOOKUP)
  keep_all, bos_only = result.record.values()
  assert keep_all["prompt_tokens"] == REGION_END and keep_all["budget_tokens"] == REGION_END
  assert bos_only["budget_tokens"] == 1 and bos_only["policy"] == BOS_ONLY
  assert keep_all["result"] == plain.record  # the whole residue table, intervals included
  np.testing.assert_array_equal(result.matrices[keep_all["matrices"]["prefix"]].correct_YxJ,
                                plain.matrices["prefix"].correct_YxJ)
  assert all("." not in key for key in result.matrices)

  # BOS only: the filler, the demonstration and the target key see position 0 and themselves;
  # a random model's answers are all wrong either way, so its predictions are compared
  (budget, prompt_len, tokens, predictions) = seen[1]
  assert (budget, prompt_len) == (1, REGION_END)
  # every target key's record sits in the evicted part, and evicting it changes predictions
  assert all(row[-1] in row[1:REGION_END] for row in tokens)
  assert (predictions[:, REGION_END:] != seen[0][3][:, REGION_END:]).any()
  np.testing.assert_array_equal(predictions,
                                _masked_predictions(context.trained, tokens, [0], REGION_END))


def test_long_needle_keeping_everything_equals_the_test_and_bos_only_its_masked_forward(context):
  # keys = values: a random model predicts about its input token, so the scored prediction
  # (after the target's key) is sometimes its value and the outcomes are not all equal
  test = dict(modulus=4, prompts_per_residue=16, key_len=1, value_len=1, seed=3,
              keys=(7, 8, 9), values=(7, 8, 9))
  prompt = 31  # the query block is the last key_len + value_len - 1 = 1 token
  options = dict(test, test="long_needle", batch_size=64,
                 policies=[dict(policy="streaming_llm", budget=prompt, sinks=0), BOS_ONLY])
  result = PROBES["eviction_lookup"](context, **options)
  keep_all, bos_only = result.record.values()
  assert keep_all["prompt_tokens"] == prompt and keep_all["matrices"] == {
      "needle": "streaming_llm-b31-sinks0_needle"}
  plain = PROBES["long_needle"](context, **test)
  assert keep_all["result"] == plain.record
  matrix = plain.matrices["needle"].correct_YxJ
  assert 0 < matrix.mean() < 1
  np.testing.assert_array_equal(result.matrices["streaming_llm-b31-sinks0_needle"].correct_YxJ,
                                matrix)

  spec = long_needle.NeedleSpec(seq_len=32, keys=test["keys"], values=test["values"],
                                filler=lookup_task.default_tokens(context.trained.config.data)[
                                    "filler"], bos=1, key_len=1, value_len=1, modulus=4,
                                prompts_per_residue=16)
  prompts = long_needle.generate(spec, test["seed"])
  outcomes = prompts.correct(_masked_predictions(context.trained, prompts.tokens, [0], prompt))
  expected = residue_accuracy.by_residue(outcomes, prompts.residues, prompts.modulus)
  np.testing.assert_array_equal(result.matrices[bos_only["matrices"]["needle"]].correct_YxJ,
                                expected)
  assert not np.array_equal(expected, matrix)  # the records' loss shows
  table = bos_only["result"]["modes"]["needle"]
  assert table["mean"] == pytest.approx(outcomes.mean())  # equal groups: mean of the residues


def test_bad_options_and_other_layer_kinds_are_refused_by_name(context):
  good = dict(policies=[KEEP_ALL])
  with pytest.raises(ConfigError, match=r"'sweep.probes.eviction_lookup.test'"):
    check({"eviction_lookup": dict(good, test="needles")})
  with pytest.raises(ConfigError, match=r"'sweep.probes.eviction_lookup.key_len'"):
    check({"eviction_lookup": dict(good, key_len=2)})  # a long needle option, test = lookup
  with pytest.raises(ConfigError, match=r"'sweep.probes.eviction_lookup.policies\[0\].policy'"):
    check({"eviction_lookup": dict(policies=[dict(policy="nope", budget=4)])})
  with pytest.raises(ConfigError, match=r"'sweep.probes.eviction_lookup.policies'"):
    check({"eviction_lookup": dict(policies=[])})
  with pytest.raises(ConfigError, match=r"'sweep.probes.eviction_lookup'.*vocabulary"):
    check({"eviction_lookup": dict(good, vocabulary="pictures")})
  # a budget the prompt cannot hold: refused before any prediction, the second policy included
  with pytest.raises(ConfigError, match="'eviction.snapkv.budget'"):
    PROBES["eviction_lookup"](context, **LOOKUP, policies=[
        BOS_ONLY, dict(policy="snapkv", budget=REGION_END + 1, window=2)])
  layers = [types.SimpleNamespace(kind="full"), types.SimpleNamespace(kind="window")]
  windowed = types.SimpleNamespace(config=types.SimpleNamespace(
      model=types.SimpleNamespace(layers=layers)), workdir="-")
  with pytest.raises(ConfigError, match=r"'model.layers\[1\].kind'"):
    PROBES["eviction_lookup"](ProbeContext(windowed, None, "unit", (4,)), policies=[KEEP_ALL])
  # full_only: the same model records nothing instead (a sweep mixing attention kinds)
  skipped = PROBES["eviction_lookup"](ProbeContext(windowed, None, "unit", (4,)),
                                      policies=[KEEP_ALL], full_only=True)
  assert skipped.record is None and not skipped.matrices
