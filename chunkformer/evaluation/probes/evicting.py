"""Greedy predictions of a full-attention model whose cache was pruned after each row's prompt.

``EvictingPredictor`` is a ``decoding.DecodingPredictor`` whose prefill applies an eviction
policy, so any probe that takes a predictor (the needle shift sweep, the lookup tests) runs
under an eviction policy unchanged. Predictions at t < prompt_len come from the prefill, before
anything is evicted (the one at prompt_len - 1 included); those at t >= prompt_len read the
pruned cache. A probe therefore ends the prompt at or before its first scored target.
"""

from __future__ import annotations

from chunkformer.evaluation.probes import decoding
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.eviction import Policy


class EvictingPredictor(decoding.DecodingPredictor):
  """``trained.Predictor`` with the cache pruned by ``policy`` after ``prompt_len`` tokens."""

  def __init__(self, trained: trained_lib.TrainedModel, batch_size: int, policy: Policy,
               prompt_len: int):
    super().__init__(trained, batch_size, prompt_len, eviction=policy)
    policy.tokens(prompt_len)  # a budget the prompt cannot hold: refused before any work
    self.policy = policy
