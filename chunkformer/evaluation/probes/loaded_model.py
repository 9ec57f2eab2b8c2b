"""Sweeps and probes on a loaded model: its predictor speaks the kv task in its own tokens.

The needle shift sweep and the prefix probe build kv rows of abstract ids; for a run that is,
or starts from, a model imported with a tokenizer, ``adapt`` wraps the predictor so that rows
go in as the model's token ids and predictions come back as kv ids
(``chunkformer/run_tokens.py``). Offsets and phases stay counted in tokens. Rows already
in the model's own ids (the lookup probes' ``words`` vocabulary) take ``unmapped``.
"""

from __future__ import annotations

import numpy as np

from chunkformer import run_tokens
from chunkformer.evaluation.probes import trained as trained_lib


class MappedPredictor:
  """A ``trained.Predictor`` over kv rows for a model that speaks its tokenizer's ids."""

  def __init__(self, predictor: trained_lib.Predictor, token_map: run_tokens.TokenMap):
    self.predictor, self.token_map = predictor, token_map

  def __call__(self, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    mapped = dict(rows, inputs=self.token_map.to_model[rows["inputs"]])
    out = dict(self.predictor(mapped))
    out["predictions"] = self.token_map.to_kv[out["predictions"]]
    return out


def adapt(trained: trained_lib.TrainedModel, predictor: trained_lib.Predictor):
  """``predictor``, mapped through the model's tokenizer if it was loaded with one."""
  mapping = run_tokens.for_run(trained.workdir, trained.config)
  return predictor if mapping is None else MappedPredictor(predictor, mapping)


def unmapped(predictor):
  """The predictor under a ``MappedPredictor`` (rows already in the model's own ids)."""
  return predictor.predictor if isinstance(predictor, MappedPredictor) else predictor
