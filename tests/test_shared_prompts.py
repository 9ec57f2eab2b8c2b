"""Seeds that answer the same haystacks, pooled with the haystack as the unit: permutation
p-values unchanged, bootstrap intervals no longer narrowed by repeated haystacks."""

import numpy as np
import pytest

from chunkformer.evaluation.stats import estimates, period_tests, seed_rule, shared_prompts


def _seed(seed, y=40, j=16):
  rng = np.random.default_rng(seed)
  return (rng.random((y, j)) < 0.3 + 0.3 * (np.arange(j) % 4 == 0)).astype(float)


def test_stacked_seeds_and_seed_means_give_the_same_permutation_p_value():
  seeds = [_seed(0), _seed(1), _seed(2)]
  phases = np.arange(16) % 4
  stacked = period_tests.phase_permutation_test(seed_rule.pool_seeds(seeds), phases,
                                                num_permutations=500)
  means = period_tests.phase_permutation_test(shared_prompts.seed_means(seeds), phases,
                                              num_permutations=500)
  assert stacked == means


def test_a_repeated_seed_narrows_the_stacked_interval_but_not_the_seed_means_interval():
  one = _seed(3)
  width = lambda e: e.high - e.low  # noqa: E731
  alone = estimates.bootstrap_mean_accuracy(one)
  stacked = estimates.bootstrap_mean_accuracy(seed_rule.pool_seeds([one, one, one]))
  means = estimates.bootstrap_mean_accuracy(shared_prompts.seed_means([one, one, one]))
  assert width(means) == pytest.approx(width(alone))
  assert width(stacked) < 0.7 * width(alone)  # about 1 / sqrt(3)
  assert shared_prompts.seed_agreement([one, one, one]) == pytest.approx(3.0, rel=0.05)
  independent = [_seed(s) for s in (4, 5, 6)]
  assert shared_prompts.seed_agreement(independent) == pytest.approx(1.0, abs=0.15)


def test_seeds_over_different_haystacks_are_refused():
  with pytest.raises(Exception, match="same haystacks"):
    shared_prompts.seed_means([np.zeros((4, 8)), np.zeros((5, 8))])
