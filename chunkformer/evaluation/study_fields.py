"""Record fields for the study's judged claims, computed in ``variant_eval`` (issue 15).

- ``split_fields``: C5's split-label analysis of a plain fixed model with multi-token needles,
  from the far-depth correctness matrix and the labels fixed before any data
  (``split_labels.split_kinds_fixed``: chunks of M tokens from position 0, as the model's
  fixed compressor cuts them).
- ``init_params``: the parameters the trainer starts this config from (same seed), whose slot
  gains on the same rows are C6's null at initialisation.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from chunkformer.evaluation import split_labels
from chunkformer.evaluation import trained as trained_lib
from chunkformer.evaluation.variant_record import VariantSetup
from chunkformer.evaluation.verdicts import is_plain_fixed_setup


def json_ready(value: Any) -> Any:
  """Python types with non-finite floats as None (strict JSON), tuples as lists."""
  if isinstance(value, dict):
    return {str(k): json_ready(v) for k, v in value.items()}
  if isinstance(value, (list, tuple, np.ndarray)):
    return [json_ready(v) for v in value]
  if isinstance(value, (bool, np.bool_)):
    return bool(value)
  if isinstance(value, (int, np.integer)):
    return int(value)
  if isinstance(value, (float, np.floating)):
    return float(value) if math.isfinite(value) else None
  return value


def wants_split_labels(setup: VariantSetup) -> bool:
  """Plain fixed models whose needle can be cut partially (more than one key+value token)."""
  return (is_plain_fixed_setup(setup) and setup.task == "kv" and setup.chunk_size is not None
          and setup.key_len + setup.value_len > 2)


def split_fields(setup: VariantSetup, correct_YxJ: np.ndarray, offsets_J: np.ndarray, *,
                 depth_name: str, seed: int, num_resamples: int) -> dict[str, Any]:
  """The ``split_labels`` record field (``split_labels.split_record`` plus what it labels)."""
  m = int(setup.chunk_size)
  kinds_J = split_labels.split_kinds_fixed(offsets_J, m, setup.key_len, setup.value_len)
  record = split_labels.split_record(correct_YxJ, kinds_J, np.mod(offsets_J, m),
                                     num_resamples=num_resamples, seed=seed)
  return json_ready({"chunk_size": m, "key_len": setup.key_len, "value_len": setup.value_len,
                     "depth": depth_name, **record})


def init_params(trained: trained_lib.TrainedModel) -> Any:
  """The step-0 parameters of the trained run's config (``Runtime.init_state``, same seed)."""
  return trained.runtime.init_state().params
