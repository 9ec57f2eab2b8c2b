"""ChunkKV as published (``chunkkv``: whole chunks only, a grid over the whole prompt, the
budget rounded down to chunks) against a reference written from its description, on random
inputs; the cut-chunk variant under its own name (``chunkkv_cut``; its selection against a
numpy reference: test_eviction_policies.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from chunkformer.config_sections.errors import ConfigError
from chunkformer.eviction import POLICIES, ChunkKV, ChunkKVCut, SnapKV, from_dict, label
from chunkformer.eviction import scores as scores_lib
from chunkformer.eviction.specs import KVPRESS_SNAPKV, LayerInputs

B, K, H, D = 3, 2, 4, 8


def _reference(per_token_T, window, chunk, budget):
  """From the description: chunks of ``chunk`` tokens from position 0 over the whole prompt,
  the remainder a last chunk of its own; a chunk's score is the mean of its tokens' scores
  (summed over kv heads; SnapKV's observation window above everything); the best chunks, ties
  to the earlier, are kept whole while they fit the budget."""
  t = per_token_T.size
  score = per_token_T.astype(np.float64).copy()
  score[t - window:] = np.inf
  chunks = [np.arange(s, min(s + chunk, t)) for s in range(0, t, chunk)]
  means = [score[c].mean() for c in chunks]
  order = sorted(range(len(chunks)), key=lambda i: (-means[i], i))
  kept, used = [], 0
  for i in order:
    if used + chunks[i].size > budget:
      break
    kept.extend(chunks[i].tolist())
    used += chunks[i].size
  return sorted(kept)


@jax.jit
def _select(policy, layers, tokens, lengths):
  return policy.select(layers, tokens, lengths, policy.tokens(tokens.shape[1]))


@pytest.mark.parametrize("t, budget, window, chunk, seed", [
    (40, 23, 4, 5, 0), (43, 23, 4, 5, 1), (50, 0.5, 6, 10, 2), (37, 17, 3, 4, 3),
    (64, 30, 8, 10, 4)])
def test_whole_chunk_selection_matches_the_reference(t, budget, window, chunk, seed):
  rng = np.random.default_rng(seed)
  keys = jnp.asarray(rng.normal(size=(B, t, K, D)), jnp.float32)
  values = jnp.asarray(rng.normal(size=(B, t, K, D)), jnp.float32)
  queries = jnp.asarray(rng.normal(size=(B, window, H, D)), jnp.float32)
  tokens = jnp.zeros((B, t), jnp.int32)
  lengths = jnp.full((B,), t, jnp.int32)
  policy = ChunkKV(budget=budget, window=window, chunk=chunk, kernel=3)
  n = policy.tokens(t)
  whole = budget if isinstance(budget, int) else round(budget * t)
  assert n == t % chunk + chunk * ((whole - t % chunk) // chunk)  # rounded down to chunks
  kept = np.asarray(_select(policy, [LayerInputs(keys, values, queries)], tokens, lengths)[0])
  assert (kept == kept[:, :1]).all()  # every kv head the same positions
  per_token = np.asarray(scores_lib.snapkv_scores(keys, queries, lengths, 3, "max")).sum(1)
  for b in range(B):
    expected = _reference(per_token[b], window, chunk, n)
    np.testing.assert_array_equal(kept[b, 0], expected)
    ids, counts = np.unique(kept[b, 0] // chunk, return_counts=True)
    sizes = np.minimum(chunk, t - ids * chunk)
    np.testing.assert_array_equal(counts, sizes)  # no chunk is cut


def test_the_cut_variant_keeps_its_own_name_and_fills_the_budget_exactly():
  assert ChunkKV.name == "chunkkv" and ChunkKVCut.name == "chunkkv_cut"
  assert ChunkKVCut(budget=22, window=4, chunk=5).tokens(43) == 22
  assert ChunkKV(budget=23, window=4, chunk=5).tokens(43) == 23  # 3 + 4 x 5
  assert ChunkKV(budget=22, window=4, chunk=5).tokens(43) == 18
  policy = from_dict({"policy": "chunkkv", "budget": 20, "window": 4, "chunk": 5})
  assert type(policy) is ChunkKV and label(policy).startswith("chunkkv-b20")
  cut = from_dict({"policy": "chunkkv_cut", "budget": 20, "window": 4, "chunk": 5})
  assert type(cut) is ChunkKVCut and label(cut) == (
      "chunkkv_cut-b20-window4-kernel7-poolingmax-layer_reuse1-chunk5")


def test_an_unknown_policy_name_is_refused_naming_every_known_one():
  assert list(POLICIES) == ["streaming_llm", "snapkv", "h2o", "knorm", "chunkkv", "chunkkv_cut",
                            "content_chunkkv"]
  with pytest.raises(ConfigError, match="allowed: streaming_llm, snapkv, h2o, knorm, chunkkv, "
                     "chunkkv_cut, content_chunkkv"):
    from_dict({"policy": "chunk_kv", "budget": 20})


def test_a_budget_that_cannot_hold_the_window_chunks_is_refused():
  with pytest.raises(ConfigError, match="eviction.chunkkv.budget"):
    # the window's 7 tokens lie in the last chunk (1 token) and two chunks of 5: 11 > 6 kept
    ChunkKV(budget=8, window=7, chunk=5).tokens(41)


def test_kvpress_snapkv_settings_are_selectable():
  policy = SnapKV(budget=100, **KVPRESS_SNAPKV)
  assert (policy.window, policy.kernel, policy.pooling) == (64, 5, "avg")
  assert (SnapKV(budget=100).window, SnapKV(budget=100).kernel) == (32, 7)
