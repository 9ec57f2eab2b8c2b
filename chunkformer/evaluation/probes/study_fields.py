"""Record fields for the study's judged claims (C5, C6), computed in ``sweep.unit``.

- ``split_fields``: C5's split-label analysis of a plain fixed model with multi-token needles,
  from the far-depth correctness matrix and the labels fixed before any data
  (``split_labels.split_kinds_fixed``: chunks of M tokens from position 0, as the model's
  fixed compressor cuts them).
- ``init_params``: the parameters the trainer starts this config from (same seed), whose slot
  gains on the same rows are C6's null at initialisation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.records.variant import VariantSetup, json_ready
from chunkformer.evaluation.stats import split_labels


def wants_split_labels(setup: VariantSetup) -> bool:
  """Plain fixed models whose needle can be cut partially (more than one key+value token)."""
  return (setup.is_plain_fixed and setup.task == "kv" and setup.chunk_size is not None
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
