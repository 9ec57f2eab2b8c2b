"""The ``split_labels`` record field (C5): a plain fixed model's accuracy per split label.

``split_fields`` analyses the far-depth correctness matrix of a model with multi-token needles
by the labels fixed before any data (``split_labels.split_kinds_fixed``: chunks of M tokens
from position 0, as the model's fixed compressor cuts them).
"""

from __future__ import annotations

from typing import Any

import numpy as np

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
