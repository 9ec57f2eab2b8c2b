"""Greedy predictions of a model that prefills each row's prompt and decodes the rest.

``DecodingPredictor`` speaks ``trained.Predictor``'s contract (rows in, ``{"predictions":
int32 [N, T]}`` out): the first ``prompt_len`` tokens of each row go through
``decode.prefill`` with one prefill option (an eviction policy, a sparse-prefill plan), the
rest are fed one by one through ``decode.step`` (teacher forcing: the row's own tokens, as the
forward pass reads them). Predictions at t < prompt_len come from the prefill; those at
t >= prompt_len read the cache the prefill left. Decoding keeps one document per row at
positions 0..T-1, so other rows are refused. Subclasses (``evicting.EvictingPredictor``, the
sparse-prefill study's) check their option against the model before any work.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from chunkformer import decode
from chunkformer.evaluation.probes import trained as trained_lib


@functools.partial(jax.jit, static_argnames=("model", "prompt_len", "sparse"))
def _predict(model, params, inputs_BxT, prompt_len: int, eviction, sparse):
  # eviction: a pytree (its budgets traced); sparse: a static plan (it shapes the index sets).
  logits, cache = decode.prefill(model, params, inputs_BxT[:, :prompt_len], inputs_BxT.shape[1],
                                 eviction=eviction, sparse=sparse)

  def feed(cache, token_B):
    step_logits, cache = decode.step(model, params, cache, token_B[:, None])
    return cache, jnp.argmax(step_logits, axis=-1)

  _, later_NxB = jax.lax.scan(feed, cache, inputs_BxT[:, prompt_len:].T)
  return jnp.concatenate([jnp.argmax(logits, axis=-1), later_NxB.T], axis=1).astype(jnp.int32)


class DecodingPredictor:
  """``trained.Predictor`` prefilling ``prompt_len`` tokens with ``eviction`` or ``sparse``."""

  def __init__(self, trained: trained_lib.TrainedModel, batch_size: int, prompt_len: int, *,
               eviction=None, sparse=None):
    seq_len = trained.config.data.seq_len
    if not 1 <= prompt_len < seq_len:
      raise ValueError(f"prompt_len {prompt_len} must lie in [1, {seq_len}) (data.seq_len)")
    self.trained, self.batch_size, self.prompt_len = trained, batch_size, prompt_len
    self._options = dict(eviction=eviction, sparse=sparse)

  def __call__(self, rows: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    inputs = np.asarray(rows["inputs"], np.int32)
    n, t = inputs.shape
    if n == 0:
      raise ValueError("no rows to predict")
    if t != self.trained.config.data.seq_len:
      raise ValueError(f"rows have {t} tokens; the model was trained on data.seq_len = "
                       f"{self.trained.config.data.seq_len}")
    if not (np.asarray(rows["positions"]) == np.arange(t)).all():
      raise ValueError("rows['positions']: decoding runs rows at positions 0..T-1 only")
    if np.asarray(rows["segment_ids"]).any():
      raise ValueError("rows['segment_ids']: decoding runs one document per row only")
    pieces = []
    with self.trained.runtime.context():
      for start in range(0, n, self.batch_size):
        index = np.minimum(np.arange(start, start + self.batch_size), n - 1)
        out = _predict(self.trained.runtime.model, self.trained.params,
                       jnp.asarray(inputs[index]), self.prompt_len, **self._options)
        pieces.append(np.asarray(out)[:min(self.batch_size, n - start)])
    return {"predictions": np.concatenate(pieces)}
