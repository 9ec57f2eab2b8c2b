"""One trained model taken apart: slot gains, attention to the needle, and the boundaries used.

The analyses behind ``notebooks/anatomy_of_a_weak_spot.ipynb``, for fixed and dynamic models:
- ``predictor``: one jitted forward pass returning the predictions, the slot-gain sums of
  ``slot_gain.extract``, every layer's attention weights (``attention_weights``, at one query
  position) and, for dynamic models, the end flags the model used;
- ``slot_gains``: ``slot_gain.analyze`` over held-out training rows;
- ``needle_attention``: the needle shift sweep at one depth, scored, with the weight the
  answering query puts on the entries holding the needle's key and value, and each row's
  phase (offset mod M for fixed chunks; offset inside the chunk the needle's key actually
  landed in for dynamic ones, ``needle_sweep.chunk_phases``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from chunkformer.chunking import boundaries as chunk_boundaries
from chunkformer.config import AttentionConfig
from chunkformer.evaluation.probes import attention_weights, needle_sweep, slot_gain
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.probes.sown_boundaries import end_flags


def predictor(model: trained_lib.TrainedModel, batch_size: int,
              query: int | None = None) -> trained_lib.Predictor:
  """Predictions, ``pool_sum/...``/``pool_count/...``, attention weights at position ``query``
  (``attn_*``/``token_entry`` of ``attention_weights.extractor``; all positions if None) and,
  for dynamic models, ``ends`` [N, T]."""
  config = model.config.model
  attention, capture = attention_weights.extractor(
      config, model.params, queries=None if query is None else (query,))

  def extract(collections, rows):
    intermediates = collections.get(trained_lib.INTERMEDIATES, {})
    out = dict(slot_gain.extract(intermediates), **attention(collections, rows))
    ends = end_flags(config, intermediates)
    if ends is not None:
      out["ends"] = ends
    return out

  return trained_lib.Predictor(model, batch_size, extract=extract, capture=capture)


def slot_gains(model: trained_lib.TrainedModel, run: trained_lib.Predictor,
               num_rows: int) -> dict[str, Any]:
  """``slot_gain.analyze`` of the model over ``num_rows`` held-out rows."""
  out = run(trained_lib.heldout_rows(model.config, num_rows))
  sums = {k: v.sum(axis=0) for k, v in out.items() if k.startswith("pool_")}
  return slot_gain.analyze(model.params, model.config.model, sums)


@dataclasses.dataclass(frozen=True)
class NeedleAttention:
  """The sweep rows of one depth, [N] per row (row s * K + k: haystack s, offset k)."""

  rows: needle_sweep.SweepRows
  outputs: dict[str, np.ndarray]  # the predictor's outputs on ``rows``
  correct_N: np.ndarray  # 1.0 iff the whole answer was predicted
  phase_N: np.ndarray  # offset mod M (fixed), or offset inside the actual chunk (dynamic)
  by_layer: dict[int, dict[str, np.ndarray]]  # attention_weights.needle_entry_attention per layer


def answer_query(rows: needle_sweep.SweepRows) -> int:
  """The position of the query that answers every row (the same in every sweep row)."""
  positions = np.unique(rows.answer_start_N)
  if positions.size != 1:
    raise ValueError(f"sweep rows answer at several positions {positions.tolist()}")
  return int(positions[0])


def needle_attention(model: trained_lib.TrainedModel, run: trained_lib.Predictor,
                     rows: needle_sweep.SweepRows, chunk_size: int) -> NeedleAttention:
  """Scores ``rows`` and reads the answering query's attention to the needle (module doc).

  ``run`` must keep the weights at ``answer_query(rows)`` (``predictor(..., query=...)``).
  """
  out = run(rows.rows)
  n = len(rows.layouts)
  correct, _ = needle_sweep.score_answers(out["predictions"], rows.rows["targets"], np.arange(n),
                                          rows.answer_start_N, rows.answer_stop_N)
  offsets = np.tile(rows.offsets_J, rows.shape[0])
  if "ends" in out:
    phases = needle_sweep.chunk_phases(out["ends"], offsets)
  else:
    phases = offsets % chunk_size
  key_len = model.config.data.key_len
  layers = sorted(int(k.split("/")[1]) for k in out if k.startswith("attn_entries/"))
  by_layer = {layer: attention_weights.needle_entry_attention(out, rows, layer, key_len)
              for layer in layers}
  return NeedleAttention(rows, out, correct, phases, by_layer)


def group_means(values_N: np.ndarray, groups_N: np.ndarray,
                groups: Sequence[Any] | None = None) -> tuple[list[Any], np.ndarray]:
  """(groups, mean of ``values`` per group), groups ascending unless given (NaN if empty)."""
  values_N, groups_N = np.asarray(values_N, np.float64), np.asarray(groups_N)
  groups = sorted(np.unique(groups_N).tolist()) if groups is None else list(groups)
  means = np.array([values_N[groups_N == g].mean() if np.any(groups_N == g) else np.nan
                    for g in groups])
  return groups, means


def rule_end_flags(attn: AttentionConfig, tokens_T: Sequence[int]) -> np.ndarray:
  """bool ends_T that a dynamic layer configured as ``attn`` (boundary 'delimiter' or 'fixed')
  uses on one document of tokens: ``chunking.boundaries.predict_end_flags``, as the layer."""
  if attn.boundary == "router":
    raise ValueError("the router's boundaries need a trained model: read them from its "
                     "forward pass (predictor outputs 'ends')")
  tokens_T = np.asarray(tokens_T, np.int32)
  # End flags are causal, so trailing padding changes none of them; padding to a multiple of
  # 128 with a non-delimiter token lets texts of similar length share one compiled program.
  pad = next(i for i in range(len(attn.delimiter_ids) + 1) if i not in attn.delimiter_ids)
  length = -(-max(tokens_T.size, 1) // 128) * 128
  tokens = jnp.asarray(np.pad(tokens_T, (0, length - tokens_T.size), constant_values=pad)[None])
  ends = _predict_end_flags(attn, tokens, jnp.arange(length)[None], jnp.zeros_like(tokens), None)
  return np.asarray(ends)[0, :tokens_T.size]


# One compiled program instead of an eager associative scan (seconds of op-by-op dispatch).
_predict_end_flags = jax.jit(chunk_boundaries.predict_end_flags, static_argnums=0)
