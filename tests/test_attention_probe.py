"""Attention weights recovered for analysis: they reproduce the layers' outputs exactly."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from chunkformer import runtime as runtime_lib
from chunkformer.attention.common import OutputProjection, derotate
from chunkformer.attention.compressed_core import compressed_attention
from chunkformer.compression import fixed_chunks
from chunkformer.config import AttentionConfig, Config, DataConfig, ModelConfig, TrainConfig
from chunkformer.evaluation.probes import attention_weights, needle_sweep
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.explainers import anatomy
from chunkformer.model import Transformer

B, T, H, K, D = 2, 20, 4, 2, 8


def _normal(seed, *shape):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _documents():
  seg = np.zeros((B, T), np.int32)
  seg[0, 9:] = 1  # row 0: two documents, row 1: one
  return jnp.asarray(seg)


def _mix(weights, v_BxTxKxD, entries_v_BxCxKxD):
  """o_BxTxHxD = weights . values (query head h reads kv head h // (H/K))."""
  g = H // K
  v = jnp.repeat(v_BxTxKxD, g, axis=2)
  ev = jnp.repeat(entries_v_BxCxKxD, g, axis=2)
  return (jnp.einsum("bths,bshd->bthd", weights.raw_BxTxHxS, v)
          + jnp.einsum("bthc,bchd->bthd", weights.entries_BxTxHxC, ev))


def test_weights_times_values_give_the_fixed_kinds_output():
  q, k, v = _normal(0, B, T, H, D), _normal(1, B, T, K, D), _normal(2, B, T, K, D)
  seg, sink = _documents(), _normal(3, H)
  offsets = jnp.asarray([[0, 2], [1, 3]], jnp.int32)  # staggered per kv head and row
  entries = _normal(4, B, -(-T // 4), K, D)

  @jax.jit
  def both(q, k, v, seg, sink, offsets, entries):
    chunks = fixed_chunks(T, 4, offsets, B, K, None, seg)
    layout = dict(entry_k_BxCxKxD=entries, entry_segment_ids_BxCxK=chunks.segment_ids_BxCxK,
                  sink_H=sink)
    return (compressed_attention(q, k, v, seg, window=3, entry_ends_BxCxK=chunks.ends_BxCxK,
                                 **layout),
            attention_weights.attention_weights(q, k, seg, window=3,
                                              entry_visible_from_BxCxK=chunks.ends_BxCxK,
                                              **layout))

  want, weights = both(q, k, v, seg, sink, offsets, entries)
  np.testing.assert_allclose(_mix(weights, v, entries), want, atol=1e-5)
  total = (weights.raw_BxTxHxS.sum(-1) + weights.entries_BxTxHxC.sum(-1) + weights.sink_BxTxH)
  np.testing.assert_allclose(total, 1.0, atol=1e-5)


def test_weights_times_values_give_the_packed_kernel_reference_output():
  q, k, v = _normal(5, B, T, H, D), _normal(6, B, T, K, D), _normal(7, B, T, K, D)
  seg = _documents()
  ends = jnp.asarray(np.random.default_rng(8).random((B, T)) < 0.35)
  _, _, entry_ends, entry_seg, _, _ = kernels.chunk_structure(ends, seg, 16)
  ek, ev = _normal(9, B, 16, K, D), _normal(10, B, 16, K, D)

  @jax.jit
  def both(q, k, v, seg, ek, ev, entry_ends, entry_seg):
    return (kernels.chunk_attention_reference(q, k, v, seg, ek, ev, entry_ends, entry_seg,
                                              window=0),
            attention_weights.attention_weights(
                q, k, seg, window=0, entry_k_BxCxKxD=ek,
                entry_visible_from_BxCxK=jnp.broadcast_to(entry_ends[..., None], (B, 16, K)),
                entry_segment_ids_BxCxK=jnp.broadcast_to(entry_seg[..., None], (B, 16, K))))

  want, weights = both(q, k, v, seg, ek, ev, entry_ends, entry_seg)
  np.testing.assert_allclose(_mix(weights, v, ev), want, atol=1e-5)
  # Window 0 and no entry closed yet: the first queries see nothing and weigh nothing.
  seen = np.asarray(weights.entries_BxTxHxC.sum(-1))
  first_end = int(np.asarray(entry_ends)[0, 0])
  assert (seen[0, :first_end] == 0).all() and np.allclose(seen[0, first_end:9], 1.0, atol=1e-5)


def _model(kind, **attn):
  return ModelConfig(vocab_size=32, d_model=16, num_heads=H, num_kv_heads=K, head_dim=D,
                     mlp_dim=32, attention=AttentionConfig(kind=kind, window=3, chunk_size=4,
                                                           sink=True, **attn))


def _params(model, tokens, seed):
  """Random parameters of the model's shapes (Flax init would compile its RNG: seconds)."""
  shapes = jax.eval_shape(Transformer(model).init, jax.random.key(0), tokens)["params"]
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(lambda s: jnp.asarray(rng.normal(size=s.shape) * 0.5, s.dtype),
                                nn.meta.unbox(shapes))


def _probe(model, params, tokens, layer):
  """(weights, token_entry, intermediates) of ``layer`` from one jitted forward pass."""
  @jax.jit
  def run(params, tokens):
    pos = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    seg = jnp.zeros_like(tokens)
    _, state = Transformer(model).apply({"params": params}, tokens, pos, seg,
                                        mutable=["intermediates"],
                                        capture_intermediates=attention_weights.capture_filter)
    inter = state["intermediates"]
    return (*attention_weights.layer_attention(model, params, inter, layer, seg, pos), inter)
  return run(params, tokens)


def test_fixed_layer_and_its_packed_twin_attend_alike():
  # The dynamic kind with boundary="fixed" runs a fixed checkpoint through the packed path:
  # same entries (one document), so the same attention weights and the same token -> entry map.
  fixed, packed = _model("fixed"), _model("dynamic", boundary="fixed")
  tokens = jnp.asarray(np.random.default_rng(11).integers(0, 32, (B, T)), jnp.int32)
  params = _params(fixed, tokens, 0)
  (w_fixed, entry_fixed, _), (w_packed, entry_packed, _) = (
      _probe(model, params, tokens, 1) for model in (fixed, packed))
  closed = T // 4  # the fixed kind's last, unfinished chunk has no packed twin
  np.testing.assert_allclose(w_fixed.raw_BxTxHxS, w_packed.raw_BxTxHxS, atol=1e-5)
  np.testing.assert_allclose(w_fixed.entries_BxTxHxC[..., :closed],
                             w_packed.entries_BxTxHxC[..., :closed], atol=1e-5)
  np.testing.assert_allclose(w_fixed.sink_BxTxH, w_packed.sink_BxTxH, atol=1e-5)
  np.testing.assert_array_equal(entry_fixed, np.broadcast_to(np.arange(T)[None, :, None] // 4,
                                                             entry_fixed.shape))
  np.testing.assert_array_equal(entry_fixed, entry_packed)


def test_query_never_weighs_a_chunk_that_ends_after_it():
  model = _model("dynamic", boundary="router", min_chunk=2, max_chunk=6)
  tokens = jnp.asarray(np.random.default_rng(12).integers(0, 32, (B, T)), jnp.int32)
  weights, token_entry, intermediates = _probe(model, _params(model, tokens, 1), tokens, 0)
  ends = np.asarray(intermediates["block_0"]["attn"]["entry_ends"][0])
  w = np.asarray(weights.entries_BxTxHxC)
  late = ends[:, None, None, :] > np.arange(T)[None, :, None, None]
  assert (w[np.broadcast_to(late, w.shape)] == 0).all()
  # Every token of a closed chunk maps to the entry whose span holds it.
  for b in range(B):
    for t in range(T):
      c = int(token_entry[b, t, 0])
      if c < ends.shape[1]:
        start = ends[b, c - 1] + 1 if c else 0
        assert start <= t <= ends[b, c]
      else:
        assert t > ends[b][ends[b] < T].max(initial=-1)


@pytest.fixture(scope="module")
def tiny_fixed_model():
  config = Config(model=_model("fixed"), data=DataConfig(seq_len=32, batch_size=4, num_pairs=3,
                                                          num_queries=2, num_symbols=8,
                                                          near_distance=8),
                  train=TrainConfig(steps=0)).validate()
  rt = runtime_lib.build(config)
  rng = np.random.default_rng(13)
  params = jax.tree_util.tree_map(lambda s: jnp.asarray(rng.normal(size=s.shape), s.dtype),
                                  rt.abstract_state.params)
  return trained_lib.TrainedModel("", config, rt, params, 0)


def test_needle_attention_finds_needles_cut_between_key_and_value(tiny_fixed_model):
  model = tiny_fixed_model
  spec = needle_sweep.NeedleSweepSpec(num_offsets=8, num_haystacks=2, depths=(0.0,), align=4)
  rows = needle_sweep.build(model.config.data, spec)[0]
  run = anatomy.predictor(model, 16, query=anatomy.answer_query(rows))
  probe = anatomy.needle_attention(model, run, rows, 4)
  offsets = np.tile(rows.offsets_J, 2)
  np.testing.assert_array_equal(probe.phase_N, offsets % 4)
  for layer, reading in probe.by_layer.items():
    # 1-token key and value: split exactly at the last phase of a chunk.
    np.testing.assert_array_equal(reading["split"], offsets % 4 == 3)
    np.testing.assert_array_equal(reading["key_entry_index"], offsets // 4)
    weights = probe.outputs[f"attn_entries/{layer}"][:, 0]  # N x H x C at the query
    np.testing.assert_allclose(reading["key_entry"],
                               weights[np.arange(len(offsets)), :, offsets // 4], atol=1e-6)
    assert (reading["raw_needle"] == 0).all()  # far needles lie outside the window of 3
  groups, means = anatomy.group_means(probe.correct_N, probe.phase_N)
  assert groups == [0, 1, 2, 3] and means.shape == (4,)


@pytest.mark.parametrize("attn", [
    dict(boundary="router", router_rule="start", min_chunk=2, max_chunk=6),
    dict(boundary="fixed"),
    dict(boundary="delimiter", delimiters="3,7", min_chunk=1, max_chunk=6),
], ids=["router_start", "fixed", "delimiter"])
def test_probe_weights_times_values_give_the_dynamic_layer_output(attn):
  # The probe must see each entry from the position the layer does: under the router's
  # 'start' rule one token after the chunk's end.
  model = _model("dynamic", **attn)
  tokens = jnp.asarray(np.random.default_rng(14).integers(0, 32, (B, T)), jnp.int32)
  params = _params(model, tokens, 2)
  capture = lambda module, method: (attention_weights.capture_filter(module, method)
                                    or isinstance(module, OutputProjection))

  @jax.jit
  def run(params, tokens):
    pos = jnp.broadcast_to(jnp.arange(T), tokens.shape)
    seg = _documents()
    _, state = Transformer(model).apply({"params": params}, tokens, pos, seg,
                                        mutable=["intermediates"], capture_intermediates=capture)
    inter = state["intermediates"]
    out = {}
    for layer in range(model.num_layers):
      weights, _ = attention_weights.layer_attention(model, params, inter, layer, seg, pos)
      attn_inter = inter[f"block_{layer}"]["attn"]
      _, _, v = attn_inter["qkv"]["__call__"][0]
      entries = attn_inter["entries"][0]
      o = _mix(weights, v, entries.get("v", entries.get("kv")))
      o = derotate(model, model.layer_attention(layer), o, pos)  # values carry RoPE: undo at t
      out[layer] = (OutputProjection(model).apply(
          {"params": params[f"block_{layer}"]["attn"]["out"]}, o),
                    attn_inter["out"]["__call__"][0])
    return out

  for layer, (got, want) in run(params, tokens).items():
    np.testing.assert_allclose(got, want, atol=1e-5, err_msg=f"layer {layer}")
