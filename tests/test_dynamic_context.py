"""The dynamic kind's entry capacity per shard (chunkformer/attention/dynamic_context.py).

A fresh process with 8 fake CPU devices (tests/dynamic_context_worker.py) pools rows whose
chunks cross shard edges, some of them more than one edge, with the tokens split over
context = 8 and data 2 x context 4, and on one device; end flags (the length rules run per
shard) must be equal, entries and gradients agree within 1e-5. The model-level equality of
the dynamic layers (router and delimiter): tests/test_context_parallel.py."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from chunkformer import chunking
from chunkformer.attention import dynamic_context
from chunkformer.chunking import boundaries
from tests import context_parallel_worker as cp
from tests import dynamic_context_worker as worker
from tests import fake_devices


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
  out = tmp_path_factory.mktemp("dynamic_context") / "pooled.npz"
  fake_devices.run([worker.__file__, "--out", out], devices=8, timeout=600)
  with np.load(out) as arrays:
    return dict(arrays)


def test_the_rows_have_chunks_across_one_and_several_shard_edges(pooled):
  spans = pooled["edges_spanned"]
  assert (spans == 1).any() and (spans >= 2).any(), spans


@pytest.mark.parametrize("mesh", worker.MESHES, ids=lambda m: "x".join(map(str, m)))
@pytest.mark.parametrize("name", ["entries", "d_values", "d_logits", "d_slot_bias"])
def test_pooled_over_shards_equals_one_device(pooled, mesh, name):
  reference = pooled[f"one/{name}"]
  assert np.abs(reference).max() > 0.1  # real entries and gradients, not zeros
  got = pooled["x".join(map(str, mesh)) + f"/{name}"]
  np.testing.assert_allclose(got, reference, atol=1e-5, rtol=0)


@pytest.mark.parametrize("mesh", worker.MESHES, ids=lambda m: "x".join(map(str, m)))
def test_length_rules_per_shard_give_one_devices_end_flags(pooled, mesh):
  """Each shard scans its own tokens from the state the earlier shards leave (max_chunk closes
  chunks that began shards earlier)."""
  assert pooled["one/ends"].sum() >= 8
  np.testing.assert_array_equal(pooled["x".join(map(str, mesh)) + "/ends"], pooled["one/ends"])


@pytest.mark.parametrize("shard_len,shortest,expected", [(6, 3, 2), (7, 3, 3), (16384, 2, 8192),
                                                         (5, 8, 1)])
def test_entries_per_shard_is_ceil_of_shard_over_shortest_chunk(shard_len, shortest, expected):
  assert dynamic_context.entries_per_shard(shard_len, shortest) == expected


def test_no_window_of_the_shard_length_holds_more_ends_than_the_capacity():
  """The bound the per-shard capacity rests on: closed chunks hold >= min_chunk tokens, so any
  L consecutive tokens hold at most ceil(L / min_chunk) chunk ends (dense proposals, documents
  of every length)."""
  rng = np.random.default_rng(3)
  proposals = rng.random((64, 96)) < 0.7
  segment_ids = np.cumsum(rng.random((64, 96)) < 0.05, axis=1)
  enforce = jax.jit(chunking.enforce_lengths, static_argnames=("min_chunk", "max_chunk"))
  for min_chunk, max_chunk in ((2, 8), (4, 4)):
    ends = np.asarray(enforce(jnp.asarray(proposals), jnp.asarray(segment_ids),
                              min_chunk=min_chunk, max_chunk=max_chunk))
    for length in (5, 6, 12):
      windows = np.lib.stride_tricks.sliding_window_view(ends, length, axis=1).sum(-1)
      bound = dynamic_context.entries_per_shard(length, min_chunk)
      assert windows.max() <= bound
      assert bound == math.ceil(length / min_chunk)
      if min_chunk == max_chunk:  # every chunk closes at max_chunk: the bound is reached
        assert windows.max() == bound


def test_refuses_a_shard_length_of_zero():
  with pytest.raises(ValueError, match="shard_len"):
    dynamic_context.entries_per_shard(0, 2)


def test_the_model_level_case_has_a_delimiter_chunk_across_two_shard_edges():
  """tests/test_context_parallel.py's batch: at context = 8 (6 tokens per shard) its delimiter
  layer (chunks of 3..8 tokens) closes a chunk that spans two shard edges, so the model-level
  equality covers pieces merged from more than one earlier shard."""
  config = cp.make_config((1, 1, 1, 1))
  batch = cp.make_batch(config.model.vocab_size)
  attn = config.model.layers[list(cp.LAYERS).index("dynamic_delimiter")]
  ends = jax.jit(lambda t, p, s: boundaries.predict_end_flags(attn, t, p, s, None))(
      batch["inputs"], batch["positions"], batch["segment_ids"])
  structure = kernels.chunk_structure(ends, jnp.asarray(batch["segment_ids"]), cp.SEQ_LEN)
  valid = np.asarray(structure.entry_ends_BxC) != kernels.PAD_END
  shard = cp.SEQ_LEN // 8
  spans = (np.asarray(structure.entry_ends_BxC) // shard
           - np.asarray(structure.entry_starts_BxC) // shard)
  assert np.where(valid, spans, 0).max() == 2
