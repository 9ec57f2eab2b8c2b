"""Eviction policies as pure functions: exact budgets, hand-computed SnapKV, the cut-chunk
ChunkKV against a dense numpy reference (ChunkKV as published: test_chunkkv.py), rows
independent, bad settings refused by name."""

import functools
from fractions import Fraction

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from chunkformer.config import AttentionConfig, ModelConfig
from chunkformer.config_sections.errors import ConfigError
from chunkformer.evaluation.probes import sown_boundaries
from chunkformer.eviction import (
  H2O,
  ChunkKV,
  ChunkKVCut,
  ContentChunkKV,
  Delimiter,
  KNorm,
  Router,
  SnapKV,
  StreamingLLM,
  from_dict,
  label,
  select,
  short_label,
)
from chunkformer.eviction import scores as scores_lib
from chunkformer.eviction.specs import LayerInputs
from chunkformer.model import Transformer

B, T, K, H, D = 3, 24, 2, 4, 8

POLICIES = [
    StreamingLLM(budget=9, sinks=3),
    SnapKV(budget=9, window=3, kernel=3),
    SnapKV(budget=0.5, window=4, kernel=1, pooling="avg"),
    H2O(budget=9, recent=2),
    KNorm(budget=7),
    ChunkKV(budget=11, window=3, chunk=5, kernel=3),  # rounded down to 4 + 5 = 9 tokens
    ChunkKVCut(budget=11, window=3, chunk=4, kernel=3),
    ContentChunkKV(budget=10, window=2, boundaries=Delimiter((1, 2), max_chunk=6)),
]


def _layer(seed, b=B):
  rng = np.random.default_rng(seed)
  keys = jnp.asarray(rng.normal(size=(b, T, K, D)), jnp.float32)
  values = jnp.asarray(rng.normal(size=(b, T, K, D)), jnp.float32)
  queries = jnp.asarray(rng.normal(size=(b, T, H, D)), jnp.float32)
  tokens = jnp.asarray(rng.integers(0, 6, (b, T)), jnp.int32)
  return keys, values, queries, tokens


def _full_lengths(b=B):
  return jnp.full((b,), T, jnp.int32)  # one dtype everywhere: compiled selections are reused


@jax.jit
def _select(policy, layers, tokens, lengths):
  """policy.select, compiled (a policy is a pytree of static settings: one compile each)."""
  return policy.select(layers, tokens, lengths, policy.tokens(tokens.shape[1]))


def _kept(policy, keys, values, queries, tokens):
  lengths = _full_lengths(keys.shape[0])
  w = policy.queries(T)
  layer = LayerInputs(keys, values, queries[:, T - w:])
  return np.asarray(_select(policy, [layer], tokens, lengths)[0])


@pytest.mark.parametrize("policy", POLICIES, ids=label)
def test_each_policy_keeps_exactly_its_budget_and_rows_are_independent(policy):
  keys, values, queries, tokens = _layer(0)
  kept = _kept(policy, keys, values, queries, tokens)
  n = policy.tokens(T)
  assert kept.shape == (B, K, n)
  for row in kept.reshape(-1, n):
    assert len(set(row.tolist())) == n and (np.diff(row) > 0).all() and row.max() < T
  # row 0 alone, and beside other rows: the same selection
  other = _layer(1)
  mixed = [jnp.concatenate([a[:1], o[1:]]) for a, o in zip((keys, values, queries, tokens),
                                                            other, strict=True)]
  np.testing.assert_array_equal(_kept(policy, *mixed)[0], kept[0])
  if not isinstance(policy, StreamingLLM):  # content-blind: the same for every row
    assert not (kept[1:] == _kept(policy, *mixed)[1:]).all()  # the other rows did change


@pytest.mark.parametrize("policy", POLICIES, ids=label)
def test_padding_past_a_rows_length_is_never_kept(policy):
  keys, values, queries, tokens = _layer(2)
  lengths = jnp.asarray([T, T - 5, T - 2], jnp.int32)
  n = policy.tokens(T)
  # a row's last W queries are its last valid tokens: gather them per row
  w = policy.queries(T)
  rows = jnp.arange(B)[:, None]
  q = queries[rows, lengths[:, None] - w + jnp.arange(w)]
  kept = np.asarray(_select(policy, [LayerInputs(keys, values, q)], tokens, lengths)[0])
  assert (kept < np.asarray(lengths)[:, None, None]).all()
  assert kept.shape == (B, K, n)


def test_streaming_llm_keeps_the_sinks_and_the_most_recent_tokens():
  keys, values, queries, tokens = _layer(3)
  kept = _kept(StreamingLLM(budget=7, sinks=2), keys, values, queries, tokens)
  np.testing.assert_array_equal(kept, np.broadcast_to([0, 1, 19, 20, 21, 22, 23], (B, K, 7)))


def test_knorm_keeps_the_smallest_key_norms_per_kv_head():
  keys, values, queries, tokens = _layer(4)
  kept = _kept(KNorm(budget=5), keys, values, queries, tokens)
  norms = np.linalg.norm(np.asarray(keys), axis=-1)  # B x T x K
  for b in range(B):
    for k in range(K):
      np.testing.assert_array_equal(kept[b, k], np.sort(np.argsort(norms[b, :, k])[:5]))


def _hand_case():
  """One kv head read by two query heads (D = 1), T = 6, the last W = 2 queries.

  Keys are log a_s, so query head 0 (q = 1) weights key s by a_s over the keys it sees; head 1
  (q = 0) weights them uniformly. Query 4 sees keys 0..4, query 5 sees 0..5.
  """
  a = [1, 2, 4, 3, 1, 2]
  keys = jnp.log(jnp.asarray(a, jnp.float32)).reshape(1, 6, 1, 1)
  queries = jnp.asarray([[1.0, 0.0], [1.0, 0.0]]).reshape(1, 2, 2, 1)
  head0 = [Fraction(a[s], sum(a[:5])) * (s < 5) + Fraction(a[s], sum(a)) for s in range(6)]
  head1 = [Fraction(1, 5) * (s < 5) + Fraction(1, 6) for s in range(6)]
  expected = [(x + y) / 2 for x, y in zip(head0, head1, strict=True)]  # GQA average
  return keys, queries, expected


def test_snapkv_scores_pooling_and_window_match_a_hand_computed_case():
  keys, queries, raw = _hand_case()
  lengths = jnp.asarray([6])
  got = np.asarray(scores_lib.query_attention(keys, queries, lengths))[0, 0]
  np.testing.assert_allclose(got, [float(x) for x in raw], rtol=1e-6)
  prefix = raw[:4]  # the window's keys (4, 5) are not pooled into the prefix
  padded = [0] + prefix + [0]
  avg = [float(sum(padded[i:i + 3]) / 3) for i in range(4)]
  best = [float(max(prefix[max(0, i - 1):i + 2])) for i in range(4)]
  pooled_avg = np.asarray(scores_lib.snapkv_scores(keys, queries, lengths, 3, "avg"))[0, 0, :4]
  pooled_max = np.asarray(scores_lib.snapkv_scores(keys, queries, lengths, 3, "max"))[0, 0, :4]
  np.testing.assert_allclose(pooled_avg, avg, rtol=1e-6)
  np.testing.assert_allclose(pooled_max, best, rtol=1e-6)
  # avg: 2 (4 + 3 + 2 on both sides) beats 1; max: 1, 2, 3 tie at key 2's score: earliest win;
  # the window (4, 5) stays although key 5 scores lowest of all
  values = jnp.zeros_like(keys)
  layer = [LayerInputs(keys, values, queries)]
  tokens = jnp.zeros((1, 6), jnp.int32)
  avg_kept = _select(SnapKV(budget=4, window=2, kernel=3, pooling="avg"), layer, tokens,
                     lengths)[0]
  max_kept = _select(SnapKV(budget=4, window=2, kernel=3), layer, tokens, lengths)[0]
  assert np.argsort(avg)[::-1][:2].tolist() == [2, 1]
  np.testing.assert_array_equal(avg_kept[0, 0], [1, 2, 4, 5])
  np.testing.assert_array_equal(max_kept[0, 0], [1, 2, 4, 5])


def _reference_chunks(scores, ends, budget, prefix):
  """Dense numpy ChunkKV selection of one row: whole chunks by mean score, the last one cut."""
  chunks, start = [], 0
  for t in range(prefix):
    if ends[t] or t == prefix - 1:
      chunks.append(list(range(start, t + 1)))
      start = t + 1
  order = sorted(range(len(chunks)), key=lambda c: (-np.mean(scores[chunks[c]]), c))
  kept = []
  for c in order:
    kept += chunks[c][:budget - len(kept)]
  return np.array(sorted(kept))


@pytest.mark.parametrize("seed", range(4))
def test_whole_chunks_equal_a_dense_numpy_reference_on_random_scores(seed):
  rng = np.random.default_rng(seed)
  scores = rng.normal(size=(4, 30)).astype(np.float32)
  ends = rng.random((4, 30)) < 0.25
  ends[1] = (np.arange(30) + 1) % 5 == 0  # one row on a fixed grid
  prefix = np.array([30, 27, 22, 9])
  budget = 8
  keep = np.asarray(jax.jit(select.whole_chunks, static_argnums=2)(
      jnp.asarray(scores), jnp.asarray(ends), budget, jnp.asarray(prefix)))
  for b in range(4):
    expected = _reference_chunks(scores[b], ends[b], budget, prefix[b])
    np.testing.assert_array_equal(np.flatnonzero(keep[b]), expected)


def test_chunkkv_cut_keeps_whole_grid_chunks_plus_the_window():
  keys, values, queries, tokens = _layer(5)
  policy = ChunkKVCut(budget=11, window=3, chunk=4, kernel=3)  # 8 = two whole chunks of 4
  kept = _kept(policy, keys, values, queries, tokens)
  assert (kept == kept[:, :1]).all()  # every kv head the same positions
  for row in kept[:, 0]:
    assert row[-3:].tolist() == [21, 22, 23]
    chunks = set(row[:-3] // 4)
    assert len(chunks) == 2 and sorted(row[:-3].tolist()) == sorted(
        t for c in chunks for t in range(4 * c, 4 * c + 4))
  # the chunks are the best by SnapKV's scores summed over kv heads (numpy reference)
  lengths = _full_lengths()
  pooled = np.asarray(scores_lib.snapkv_scores(keys, queries[:, -3:], lengths, 3, "max"))
  per_token = pooled.sum(axis=1)
  for b in range(B):
    expected = _reference_chunks(per_token[b], (np.arange(T) + 1) % 4 == 0, 8, T - 3)
    np.testing.assert_array_equal(kept[b, 0, :-3], expected)


def test_content_chunks_follow_the_delimiter_rule():
  keys, values, queries, tokens = _layer(6)
  tokens = jnp.asarray(np.tile([5, 5, 1, 5, 5, 5, 2, 3], (B, 3)), jnp.int32)  # delimiters 1, 2
  policy = POLICIES[-1]  # delimiters 1, 2; max_chunk 6 never binds on these chunks
  kept = _kept(policy, keys, values, queries, tokens)
  ends = np.isin(np.asarray(tokens[0]), [1, 2])
  for b in range(B):
    expected = _reference_chunks(
        np.asarray(scores_lib.snapkv_scores(keys, queries[:, -2:], _full_lengths(), 7,
                                            "max")).sum(axis=1)[b], ends, 8, T - 2)
    np.testing.assert_array_equal(kept[b, 0, :-2], expected)


@pytest.mark.parametrize("kind", [ChunkKV, ChunkKVCut])
def test_layer_reuse_shares_the_first_layers_selection(kind):
  layers = [_layer(s) for s in range(3)]
  tokens = layers[0][3]
  policy = kind(budget=11, window=3, chunk=4, kernel=3)
  alone = [_kept(policy, *layer[:3], tokens) for layer in layers]  # each layer on its own
  inputs = [LayerInputs(k, v, q[:, -3:]) for k, v, q, _ in layers]
  shared = _select(kind(budget=11, window=3, chunk=4, kernel=3, layer_reuse=2), inputs,
                   tokens, _full_lengths())
  np.testing.assert_array_equal(shared[0], alone[0])
  np.testing.assert_array_equal(shared[1], alone[0])  # reused
  np.testing.assert_array_equal(shared[2], alone[2])  # the next group chooses again
  assert not np.array_equal(alone[1], alone[0])


@pytest.mark.parametrize("make, field", [
    (lambda: SnapKV(budget=8, window=16), "eviction.snapkv.window"),
    (lambda: SnapKV(budget=8, window=4, kernel=4), "eviction.snapkv.kernel"),
    (lambda: SnapKV(budget=8, window=4, pooling="mean"), "eviction.snapkv.pooling"),
    (lambda: StreamingLLM(budget=0), "eviction.streaming_llm.budget"),
    (lambda: StreamingLLM(budget=1.5), "eviction.streaming_llm.budget"),
    (lambda: StreamingLLM(budget=4, sinks=5), "eviction.streaming_llm.sinks"),
    (lambda: ChunkKV(budget=8, window=2, chunk=0), "eviction.chunkkv.chunk"),
    (lambda: ChunkKV(budget=8, window=2, layer_reuse=0), "eviction.chunkkv.layer_reuse"),
    (lambda: ChunkKVCut(budget=8, window=2, chunk=0), "eviction.chunkkv_cut.chunk"),
    (lambda: ContentChunkKV(budget=8, window=2), "eviction.content_chunkkv.boundaries"),
    (lambda: Delimiter(()), "eviction.boundaries.ids"),
    (lambda: SnapKV(budget=64, window=8).tokens(32), "eviction.snapkv.budget"),
    (lambda: SnapKV(budget=0.1, window=8).tokens(32), "eviction.snapkv.budget"),
    (lambda: from_dict({"policy": "snap"}), "eviction.policy"),
    (lambda: from_dict({"policy": "snapkv", "budget": 8, "windw": 2}), "eviction.windw"),
    (lambda: from_dict({"policy": "content_chunkkv", "budget": 8}), "eviction.delimiters"),
])
def test_bad_settings_are_refused_naming_the_field(make, field):
  with pytest.raises(ConfigError, match=f"'{field}'"):
    make()


def test_from_dict_builds_the_policy_a_config_names():
  assert from_dict({"policy": "snapkv", "budget": 64, "window": 8}) == SnapKV(64, window=8)
  content = from_dict({"policy": "content_chunkkv", "budget": 0.25, "window": 4,
                       "delimiters": [3, 7], "max_chunk": 12})
  assert content.boundaries == Delimiter((3, 7), max_chunk=12)
  assert label(content) == ("content_chunkkv-b0.25-window4-kernel7-poolingmax-layer_reuse1-"
                            "delim3.7-len1-12")
  assert SnapKV(budget=0.25, window=2).tokens(30) == 8  # a share rounds to the nearest token
  assert jax.tree_util.tree_leaves(content) == []  # settings are static: one compile each


def test_content_chunks_from_a_trained_models_router_are_its_sown_end_flags():
  router_model = Transformer(ModelConfig(
      vocab_size=8, num_layers=1, d_model=16, num_heads=2, num_kv_heads=2, head_dim=8,
      mlp_dim=32, attention=AttentionConfig(kind="dynamic", boundary="router", chunk_size=4,
                                            window=4, min_chunk=1, max_chunk=6)))
  keys, values, queries, tokens = _layer(7)
  shapes = nn.meta.unbox(jax.eval_shape(router_model.init, jax.random.key(0), tokens)["params"])
  rng = np.random.default_rng(0)
  params = jax.tree_util.tree_map(lambda s: jnp.asarray(rng.normal(size=s.shape), s.dtype),
                                  shapes)
  policy = ContentChunkKV(budget=10, window=2, boundaries=Router(router_model, params))
  assert len(jax.tree_util.tree_leaves(policy)) == len(jax.tree_util.tree_leaves(params))
  kept = _kept(policy, keys, values, queries, tokens)  # the router's weights traced under jit
  # the flags as evaluation reads them from the model's own forward pass
  _, state = jax.jit(functools.partial(router_model.apply, mutable=["intermediates"]))(
      {"params": params}, tokens)
  ends = np.asarray(sown_boundaries.end_flags(router_model.model, state["intermediates"]))
  assert 0 < ends[:, :T - 2].sum() < B * (T - 2)  # the router did cut the prompt
  pooled = np.asarray(scores_lib.snapkv_scores(keys, queries[:, -2:], _full_lengths(), 7,
                                               "max")).sum(axis=1)
  for b in range(B):
    np.testing.assert_array_equal(kept[b, 0, :-2],
                                  _reference_chunks(pooled[b], ends[b], 8, T - 2))


def test_short_label_writes_long_runs_of_delimiter_ids_as_their_ends_only():
  long = "content_chunkkv-b16-delim" + ".".join(map(str, range(39, 71))) + "-len2-8"
  assert short_label(long) == "content_chunkkv-b16-delim39..70-len2-8"
  assert short_label("c-delim2.3.4-len1-64") == "c-delim2.3.4-len1-64"  # under four
  assert short_label("c-delim2.5.6.7.8.11-len1") == "c-delim2.5..8.11-len1"
  assert short_label("snapkv-b64-window8") == "snapkv-b64-window8"
