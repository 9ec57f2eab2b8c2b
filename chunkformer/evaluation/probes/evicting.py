"""Greedy predictions of a full-attention model whose cache was pruned after each row's prompt.

``EvictingPredictor`` speaks ``trained.Predictor``'s contract (rows in, ``{"predictions":
int32 [N, T]}`` out), so any probe that takes a predictor (the needle shift sweep, the lookup
tests) runs under an eviction policy unchanged: the first ``prompt_len`` tokens of each row go
through ``decode.prefill(..., eviction=policy)``, the rest are fed one by one through
``decode.step`` (teacher forcing: the row's own tokens, as the forward pass reads them).
Predictions at t < prompt_len come from the prefill, before anything is evicted (the one at
prompt_len - 1 included); those at t >= prompt_len read the pruned cache. A probe therefore
ends the prompt at or before its first scored target.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from chunkformer import decode
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.eviction import Policy


@functools.partial(jax.jit, static_argnames=("model", "prompt_len"))
def _predict(model, params, inputs_BxT, prompt_len: int, policy):
  logits, cache = decode.prefill(model, params, inputs_BxT[:, :prompt_len], inputs_BxT.shape[1],
                                 eviction=policy)

  def feed(cache, token_B):
    step_logits, cache = decode.step(model, params, cache, token_B[:, None])
    return cache, jnp.argmax(step_logits, axis=-1)

  _, later_NxB = jax.lax.scan(feed, cache, inputs_BxT[:, prompt_len:].T)
  return jnp.concatenate([jnp.argmax(logits, axis=-1), later_NxB.T], axis=1).astype(jnp.int32)


class EvictingPredictor:
  """``trained.Predictor`` with the cache pruned by ``policy`` after ``prompt_len`` tokens."""

  def __init__(self, trained: trained_lib.TrainedModel, batch_size: int, policy: Policy,
               prompt_len: int):
    seq_len = trained.config.data.seq_len
    if not 1 <= prompt_len < seq_len:
      raise ValueError(f"prompt_len {prompt_len} must lie in [1, {seq_len}) (data.seq_len)")
    policy.tokens(prompt_len)  # a budget the prompt cannot hold: refused before any work
    self.trained, self.batch_size = trained, batch_size
    self.policy, self.prompt_len = policy, prompt_len

  def __call__(self, rows: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    inputs = np.asarray(rows["inputs"], np.int32)
    n, t = inputs.shape
    if n == 0:
      raise ValueError("no rows to predict")
    if t != self.trained.config.data.seq_len:
      raise ValueError(f"rows have {t} tokens; the model was trained on data.seq_len = "
                       f"{self.trained.config.data.seq_len}")
    # decoding keeps one document per row at positions 0..T-1
    if not (np.asarray(rows["positions"]) == np.arange(t)).all():
      raise ValueError("rows['positions']: eviction decodes rows at positions 0..T-1 only")
    if np.asarray(rows["segment_ids"]).any():
      raise ValueError("rows['segment_ids']: eviction decodes one document per row only")
    pieces = []
    with self.trained.runtime.context():
      for start in range(0, n, self.batch_size):
        index = np.minimum(np.arange(start, start + self.batch_size), n - 1)
        out = _predict(self.trained.runtime.model, self.trained.params,
                       jnp.asarray(inputs[index]), self.prompt_len, self.policy)
        pieces.append(np.asarray(out)[:min(self.batch_size, n - start)])
    return {"predictions": np.concatenate(pieces)}
