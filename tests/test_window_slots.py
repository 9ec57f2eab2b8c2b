"""The compressor's windows built from whole chunks, and the lightning indexer's exact top-k by
a sort (and the simple indexer's k-th score by one), against references written from their
definitions; and what GSPMD makes of them when a mesh splits the tokens (a subprocess on 4 fake
CPU devices: only chunk-sized collective-permutes, no all-gather or all-reduce of windows or
scores).

Slot s of entry j holds token ``j*S + S - W + s - o`` (o the row's and head's offset); tokens
past the row's end read its last token and slots before its start hold zeros (callers mask
both). Top-k: the k highest visible scores in floats' total order (+0 above -0), ties to the
lower index, as ``lax.top_k``.
"""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from chunkformer.attention.compressed_core import select_topk
from chunkformer.attention.lightning_indexer import select_exactly_topk
from chunkformer.compression import pooling


def _windows_reference(x_BxTxK, chunks, s, w, offsets_BxK):
  b, t, k = x_BxTxK.shape
  out = np.zeros((b, chunks, w, k), x_BxTxK.dtype)
  for row in range(b):
    for head in range(k):
      for j in range(chunks):
        for slot in range(w):
          tok = j * s + s - w + slot - offsets_BxK[row, head]
          if tok >= 0:
            out[row, j, slot, head] = x_BxTxK[row, min(tok, t - 1), head]
  return out


@pytest.mark.parametrize("seq_len,s,w", [(24, 4, 8), (22, 4, 8), (24, 4, 4), (21, 4, 3),
                                         (24, 3, 8), (20, 5, 12)])
@pytest.mark.parametrize("offset", [None, "random"])
def test_windows_are_the_tokens_of_the_slot_formula(seq_len, s, w, offset):
  rng = np.random.default_rng(seq_len * 100 + s * 10 + w)
  x = rng.standard_normal((2, seq_len, 3)).astype(np.float32)
  offsets = (np.zeros((2, 3), np.int32) if offset is None
             else rng.integers(0, s, (2, 3)).astype(np.int32))
  chunks = -(-seq_len // s)
  got = pooling.window_slots(jnp.asarray(x), chunks, s, w,
                             None if offset is None else jnp.asarray(offsets))
  np.testing.assert_array_equal(np.asarray(got), _windows_reference(x, chunks, s, w, offsets))


def test_windows_carry_trailing_channel_axes():
  x = np.arange(2 * 12 * 1 * 5, dtype=np.float32).reshape(2, 12, 1, 5)
  offsets = np.array([[1], [3]], np.int32)
  got = np.asarray(pooling.window_slots(jnp.asarray(x), 3, 4, 8, jnp.asarray(offsets)))
  for channel in range(5):
    np.testing.assert_array_equal(got[..., channel],
                                  _windows_reference(x[..., channel], 3, 4, 8, offsets))


def _topk_reference(scores, visible, k):
  """Python's sort by (score descending, +0 before -0, index)."""
  selected = np.zeros(scores.shape, bool)
  for idx in np.ndindex(scores.shape[:-1]):
    row, seen = scores[idx], visible[idx]
    order = sorted(np.flatnonzero(seen), key=lambda c: (-row[c], bool(np.signbit(row[c])), c))
    selected[idx + (order[:k],)] = True
  return selected


@pytest.mark.parametrize("k", [1, 3, 7, 20])
def test_topk_is_exact_with_ties_and_signed_zeros(k):
  rng = np.random.default_rng(k)
  # (-inf is not a score: it stands for an invisible entry)
  ties = np.array([0.0, -0.0, 1.0, -1.0, 0.5, np.inf, 1e-30, -1e-30], np.float32)
  scores = rng.choice(ties, (3, 6, 11))
  scores = np.where(rng.random(scores.shape) < 0.3,
                    rng.standard_normal(scores.shape).astype(np.float32), scores)
  assert np.signbit(scores[scores == 0]).any() and (~np.signbit(scores[scores == 0])).any()
  visible = rng.random(scores.shape) < 0.7
  got = select_exactly_topk(jnp.asarray(scores), jnp.asarray(visible), k)
  np.testing.assert_array_equal(np.asarray(got), _topk_reference(scores, visible, k))


@pytest.mark.parametrize("k", [1, 3, 11, 20])
def test_simple_indexer_threshold_is_the_kth_largest_visible_score(k):
  """The simple indexer keeps every visible entry scoring at least the k-th largest visible
  score (``lax.top_k``'s k-th value), all of them when fewer than k are visible."""
  rng = np.random.default_rng(k)
  scores = rng.choice(np.array([0.0, -0.0, 1.0, 0.5, -2.0], np.float32), (2, 5, 3, 11))
  scores = np.where(rng.random(scores.shape) < 0.5,
                    rng.standard_normal(scores.shape).astype(np.float32), scores)
  visible = rng.random(scores.shape) < 0.6
  masked = np.where(visible, scores, -np.inf)
  kth = np.asarray(jax.lax.top_k(jnp.asarray(masked), min(k, 11))[0])[..., -1:]
  got = np.asarray(select_topk(jnp.asarray(scores), jnp.asarray(visible), k))
  np.testing.assert_array_equal(got, visible & (masked >= kth))
  assert (got.sum(-1) >= np.minimum(visible.sum(-1), k)).all()


def _collectives_under_context(hlo_out):
  """(op, result shape) of every collective of the two functions compiled on a 4-way token
  split (run in a subprocess with 4 fake devices)."""
  from jax.sharding import AxisType, NamedSharding
  from jax.sharding import PartitionSpec as P

  from tests.context_comms_worker import collectives

  mesh = jax.make_mesh((4,), ("context",), axis_types=(AxisType.Auto,))  # as the model's
  split = NamedSharding(mesh, P(None, "context"))
  x = jax.ShapeDtypeStruct((2, 64, 1, 6), jnp.float32, sharding=split)
  offsets = jax.ShapeDtypeStruct((2, 1), jnp.int32, sharding=NamedSharding(mesh, P()))
  scores = jax.ShapeDtypeStruct((2, 64, 16), jnp.float32, sharding=split)
  visible = jax.ShapeDtypeStruct((2, 64, 16), jnp.bool_, sharding=split)
  head_scores = jax.ShapeDtypeStruct((2, 64, 2, 16), jnp.float32, sharding=split)
  head_visible = jax.ShapeDtypeStruct((2, 64, 2, 16), jnp.bool_, sharding=split)

  def windows(x, offsets):  # S = 4, W = 8: the CSA overlap, with and without an offset
    return (pooling.window_slots(x, 16, 4, 8, None), pooling.window_slots(x, 16, 4, 8, offsets))

  found = {}
  for name, fn, args in (("windows", windows, (x, offsets)),
                         ("topk", lambda s, v: select_exactly_topk(s, v, 4), (scores, visible)),
                         ("simple_topk", lambda s, v: select_topk(s, v, 4),
                          (head_scores, head_visible))):
    hlo = jax.jit(fn).lower(*args).compile().as_text()
    found[name] = [(c["op"], c["shape"]) for c in collectives(hlo)]
  with open(hlo_out, "w") as f:
    json.dump(found, f)


def test_gspmd_sends_chunk_halos_and_keeps_scores_split(tmp_path):
  from tests import fake_devices

  out = tmp_path / "collectives.json"
  fake_devices.run([__file__, out], devices=4, timeout=300)
  with open(out) as f:
    found = json.load(f)
  # One chunk of S = 4 tokens from the previous shard for the zero offset's window, two for
  # the offset one's (its windows reach up to S - 1 tokens further back).
  assert sorted(found["windows"]) == [["collective-permute", [2, 1, 4, 1, 6]]] * 3
  assert found["topk"] == []
  assert found["simple_topk"] == []


if __name__ == "__main__":
  _collectives_under_context(sys.argv[1])
