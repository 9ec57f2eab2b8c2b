"""The position-matched tests (lookup, long needle) under inference-time eviction.

The registered probe ``eviction_lookup``: for every policy of its ``policies`` option (config
dicts as ``eviction_needles`` takes them, checked by the same rule) the test named by ``test``
(``lookup`` or ``long_needle``) runs with an ``evicting.EvictingPredictor`` whose prompt ends
where the retrievable information ends and the questions begin:
- ``lookup``: at the record region's end, so the demonstrations and the target key are decoded
  from the pruned cache;
- ``long_needle``: right before the query block (its filler token is the prompt's last).
Eviction therefore acts before the answer is produced, and a policy that drops the target's
record loses it. The test's options are those of the ``lookup`` / ``long_needle`` probes
(``lookup.lookup_test`` / ``lookup.needle_test`` build and score the prompts); an option left
None takes that test's default, and an option of the other test is refused.

Each policy's record holds the config dict, the prompt and budget in tokens, the test's record
(``lookup.ResidueTest``: accuracy per residue with Wilson intervals, mean, worst, gap,
stride-repeat, per padding mode) and the names of its correctness matrices (prompts x residue),
stored as ``eviction_lookup_<matrix key>`` (``eviction_needles.matrix_key`` of the policy's
label and the mode: no '.'). A model with other than full-attention layers is refused
(ConfigError naming the layer field), unless the option ``full_only`` is set: then such a
model records None, so a sweep that mixes attention kinds asks its full-attention units only.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from chunkformer import eviction, run_tokens
from chunkformer.config_sections.errors import ConfigError, one_of
from chunkformer.data import long_needle, lookup_task
from chunkformer.evaluation.probes import evicting, loaded_model, lookup
from chunkformer.evaluation.probes.base import ProbeContext, ProbeResult
from chunkformer.eviction import prune
from chunkformer.studies.eviction.probes import eviction_needles

NAME = "eviction_lookup"
FIELD = f"sweep.probes.{NAME}"
# test -> (its probe, whose keyword defaults are the test's; the test run with a predictor)
TESTS = {"lookup": (lookup.probe, lookup.lookup_test),
         "long_needle": (lookup.needle_probe, lookup.needle_test)}
SHARED = ("modulus", "prompts_per_residue", "seed", "stride", "keys", "values", "filler", "bos",
          "vocabulary", "word_seed", "num_keys", "num_values")
OWN = {"lookup": ("num_records", "num_demos", "paddings", "positions"),
       "long_needle": ("key_len", "value_len", "spread")}
# Options whose default differs between the tests: None in this probe's signature = the test's.
_PER_TEST = ("modulus", "seed", *OWN["lookup"], *OWN["long_needle"])


def test_options(test: str, given: Mapping[str, Any]) -> dict[str, Any]:
  """The options ``test``'s run takes: ``given`` ones, the test probe's defaults for the rest
  and for those of ``_PER_TEST`` given as None; ConfigError naming the test or an option of
  the other test."""
  one_of(test, tuple(TESTS), f"{FIELD}.test")
  for other, names in OWN.items():
    for option in names:
      if other != test and given.get(option) is not None:
        raise ConfigError(f"config field '{FIELD}.{option}': an option of test {other!r}; "
                          f"test {test!r} takes {', '.join(SHARED + OWN[test])}")
  defaults = inspect.signature(TESTS[test][0]).parameters
  names = SHARED + OWN[test]
  return {k: defaults[k].default if k not in given or (k in _PER_TEST and given[k] is None)
          else given[k] for k in names}


def check_options(policies: Sequence[Mapping[str, Any]] = (), test: str = "lookup",
                  **given) -> None:
  """The options a sweep config gives this probe, checked before anything trains
  (``registry.check``): ConfigError naming the bad entry."""
  eviction_needles.chosen_policies(policies, FIELD)
  options = test_options(test, given)
  lookup.check_vocabulary(FIELD, options["vocabulary"], options["word_seed"],
                          options["num_keys"], options["num_values"])
  lookup.check_prompt_count(FIELD, options["modulus"], options["prompts_per_residue"],
                            options.get("positions") or lookup_task.POSITION_DESIGNS[0])


def prompt_length(spec: lookup_task.LookupSpec | long_needle.NeedleSpec) -> int:
  """Tokens prefilled before eviction: the lookup's record region (its filler token and the
  demonstrations come after), the long needle's context up to its query block."""
  if isinstance(spec, lookup_task.LookupSpec):
    return spec.region_end
  return spec.query_start


def probe(context: ProbeContext, policies: Sequence[Mapping[str, Any]] = (),
          test: str = "lookup", modulus: int | None = None, prompts_per_residue: int = 0,
          seed: int | None = None, stride: int = 0, num_records: int | None = None,
          num_demos: int | None = None, paddings: Sequence[str] | None = None,
          positions: str | None = None, key_len: int | None = None,
          value_len: int | None = None, spread: int | None = None,
          keys: Sequence[int] | None = None, values: Sequence[int] | None = None,
          filler: int | None = None, bos: int | str | None = lookup.DEFAULT,
          vocabulary: str = lookup.TASK, word_seed: int = 0, num_keys: int = 0,
          num_values: int = 0, batch_size: int = 32, full_only: bool = False) -> ProbeResult:
  """The test's residue table under each policy (module docstring)."""
  chosen = eviction_needles.chosen_policies(policies, FIELD)
  options = test_options(test, dict(
      modulus=modulus, prompts_per_residue=prompts_per_residue, seed=seed, stride=stride,
      num_records=num_records, num_demos=num_demos, paddings=paddings, positions=positions,
      key_len=key_len, value_len=value_len, spread=spread, keys=keys, values=values,
      filler=filler, bos=bos, vocabulary=vocabulary, word_seed=word_seed, num_keys=num_keys,
      num_values=num_values))
  trained = context.trained
  if full_only and any(attn.kind != "full" for attn in trained.config.model.layers):
    return ProbeResult(None)
  prune.check_model(trained.config.model)
  # task rows go through a loaded model's token map, words are its own ids already
  mapping = (run_tokens.for_run(trained.workdir, trained.config)
             if vocabulary == lookup.TASK else None)

  def predictor(policy: eviction.Policy, spec) -> Any:
    # the first policy's call checks every budget on this prompt before any prediction runs
    length = prompt_length(spec)
    for _, other in chosen:
      other.tokens(length)
    predict = evicting.EvictingPredictor(trained, batch_size,
                                         eviction_needles.in_model_tokens(policy, mapping),
                                         length)
    return loaded_model.adapt(trained, predict) if vocabulary == lookup.TASK else predict

  record, matrices = {}, {}
  for spec_dict, policy in chosen:
    label = eviction.label(policy)
    lengths = set()

    def predict_for(spec, policy=policy, lengths=lengths):
      lengths.add(prompt_length(spec))
      return predictor(policy, spec)

    result, test_matrices = TESTS[test][1](context, predict_for, name=NAME, **options)
    (length,) = lengths  # every mode of a test ends its prompt at the same position
    keys_by_mode = {}
    for mode, matrix in test_matrices.items():
      keys_by_mode[mode] = eviction_needles.matrix_key(label, mode)
      matrices[keys_by_mode[mode]] = matrix
    record[label] = {"policy": spec_dict, "prompt_tokens": length,
                     "budget_tokens": policy.tokens(length), "matrices": keys_by_mode,
                     "result": result.to_record()}
  return ProbeResult(record, matrices)
