"""The ``dynamic`` attention kind: packed path, documents, causality, decoding, shared groups.

Compile time dominates on CPU, so parameters come from ``jax.eval_shape`` filled with numpy
random values (no init compile) and each model is compiled once per test.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from flax.core import meta

from chunkformer import chunking, decode
from chunkformer.attention import AttentionContext
from chunkformer.attention.dynamic import DynamicAttention
from chunkformer.attention.fixed import FixedAttention
from chunkformer.config import AttentionConfig, ModelConfig
from chunkformer.layers import RMSNorm
from chunkformer.model import Transformer
from chunkformer.objective import AUX_COLLECTIONS

T = 24
VOCAB = 32
E = 32
DELIMS = "3,4,5,6"  # ~1 token in 8 of a uniform row closes a chunk


def _model(num_layers=2, rope=True, key_shift=0, layer_pattern="", **attn) -> ModelConfig:
  return ModelConfig(vocab_size=VOCAB, num_layers=num_layers, d_model=E, num_heads=4,
                     num_kv_heads=2, head_dim=8, mlp_dim=64, rope=rope, key_shift=key_shift,
                     layer_pattern=layer_pattern,
                     attention=AttentionConfig(kind="dynamic", **attn))


def _random_params(init_fn, *args, seed=0, scale=0.3):
  """The 'params' of ``init_fn``'s structure with random values, without compiling the init.

  Matrices ~ N(0, 1/fan_in); norm scales 1 + noise; slot biases, sinks and token shifts
  noise of ``scale`` (non-zero, unlike their zero init); routers identity + noise.
  """
  shapes = meta.unbox(jax.eval_shape(init_fn, jax.random.key(0), *args)["params"])
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    names = [str(getattr(p, "key", p)) for p in path]
    n = rng.standard_normal(leaf.shape).astype(np.float32)
    if names[-1] == "embedding":
      return n
    if names[-1] == "scale":
      return 1.0 + 0.1 * n
    if names[-1] in ("w_q", "w_k"):
      return np.eye(leaf.shape[0], dtype=np.float32) + scale * n
    if names[-1] in ("ape", "sink") or names[-1].startswith("shift_"):
      return scale * n
    fan_in = leaf.shape[0] * (leaf.shape[1] if "out" in names else 1)
    return n / np.sqrt(fan_in)

  return jax.tree_util.tree_map_with_path(lambda p, x: jnp.asarray(fill(p, x)), shapes)


def _normal(seed, shape):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _tokens(seed=0, b=2, t=T):
  return jnp.asarray(np.random.default_rng(seed).integers(0, VOCAB, size=(b, t)), jnp.int32)


class PackedFixedEquivalenceTest(parameterized.TestCase):
  """boundary="fixed" through the packed path == the fixed kind, same weights (1e-5).

  Both agree on every chunk that holds M tokens. Documents here start at multiples of M: the
  fixed kind lays its chunk grid on row indices (a chunk straddling a document start becomes a
  partial chunk of the later document, slot-biased by its grid slots and rotated at a position
  below 0), while the packed path starts every document with a fresh chunk.
  """

  @parameterized.parameters(
      dict(pooling="gated", shared_kv=True, window=3, sink=True),
      dict(pooling="mean", shared_kv=False, window=0, sink=False),
  )
  def test_fixed_chunking_through_the_packed_path_equals_the_fixed_kind(self, **attn):
    fixed = AttentionConfig(kind="fixed", chunk_size=4, **attn)
    dynamic = AttentionConfig(kind="dynamic", boundary="fixed", chunk_size=4, **attn)
    model = ModelConfig(vocab_size=VOCAB, num_layers=1, d_model=E, num_heads=4, num_kv_heads=2,
                        head_dim=8, mlp_dim=64, key_shift=2, attention=fixed)
    b, t = 2, 22  # T not a multiple of M: the last chunk is unfinished
    x = _normal(0, (b, t, E))
    seg = jnp.asarray([[0] * t, [0] * 8 + [1] * 12 + [2] * 2])
    pos = jnp.asarray([list(range(t)), list(range(8)) + list(range(12)) + list(range(2))])
    ctx = AttentionContext(jnp.zeros((b, t), jnp.int32), pos, seg)
    fixed_layer = FixedAttention(model, fixed, 0)
    params = _random_params(lambda key: fixed_layer.init(key, x, ctx, {}))
    y_fixed, _ = jax.jit(lambda p: fixed_layer.apply({"params": p}, x, ctx, {}))(params)
    y_dyn, _ = jax.jit(lambda p: DynamicAttention(model, dynamic, 0).apply({"params": p}, x, ctx,
                                                                         {}))(params)
    np.testing.assert_allclose(np.asarray(y_dyn), np.asarray(y_fixed), atol=1e-5, rtol=1e-5)


class RouterLayerTest(absltest.TestCase):
  """One router layer over a row of two documents (tokens 0-9, 10-23), compiled once."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    model = _model(num_layers=1, boundary="router", min_chunk=1, max_chunk=6, window=8,
                   ratio_loss_weight=0.5)
    layer = DynamicAttention(model, model.attention, 0)
    cls.x = _normal(0, (1, T, E))
    seg = jnp.asarray([[0] * 10 + [1] * 14])
    ctx = AttentionContext(_tokens(1, b=1), jnp.asarray([list(range(10)) + list(range(14))]), seg)
    cls.params = _random_params(lambda key: layer.init(key, cls.x, ctx, {}))
    weights = _normal(4, (1, 14, E))

    def apply(params, inp):
      (y, _), aux = layer.apply({"params": params}, inp, ctx, {}, mutable=["aux_loss"])
      return y, aux["aux_loss"]["ratio_loss"][0]

    def scalars(params, inp):  # a random projection of document 1's outputs; the ratio loss
      y, ratio = apply(params, inp)
      return jnp.stack([jnp.sum(y[:, 10:] * weights), ratio]), y

    def run(params, inp):
      (d_params, d_inp), y = jax.jacrev(scalars, argnums=(0, 1), has_aux=True)(params, inp)
      return (y, d_inp[0], jax.tree_util.tree_map(lambda g: g[0], d_params),
              jax.tree_util.tree_map(lambda g: g[1], d_params))

    cls.compute = staticmethod(jax.jit(run))

  def test_no_attention_or_chunk_crosses_a_document_boundary(self):
    y, d_inp, _, _ = self.compute(self.params, self.x)
    # By gradient: no output of document 1 depends on any input of document 0.
    np.testing.assert_array_equal(np.asarray(d_inp)[:, :10], 0.0)
    self.assertGreater(float(jnp.abs(d_inp[:, 10:]).sum()), 0.0)
    # By perturbation, hard boundaries included. Document 0 closing a different number of
    # chunks moves document 1's entries inside the packed buffer: only rounding may differ.
    y_moved = self.compute(self.params, self.x.at[:, :10].add(_normal(9, (1, 10, E))))[0]
    np.testing.assert_allclose(np.asarray(y_moved)[:, 10:], np.asarray(y)[:, 10:], atol=1e-5)
    self.assertFalse(np.allclose(np.asarray(y_moved)[:, :10], np.asarray(y)[:, :10]))

  def test_router_learns_from_the_output_through_straight_through_entries(self):
    _, _, d_params, _ = self.compute(self.params, self.x)
    for name in ("w_q", "w_k"):
      self.assertGreater(float(jnp.abs(d_params["router"][name]).sum()), 0.0)

  def test_ratio_loss_reaches_the_router_and_nothing_else(self):
    _, _, _, d_ratio = self.compute(self.params, self.x)
    self.assertGreater(float(jnp.abs(d_ratio["router"]["w_q"]).sum()), 0.0)
    others = {k: v for k, v in d_ratio.items() if k != "router"}
    for leaf in jax.tree_util.tree_leaves(others):
      np.testing.assert_array_equal(np.asarray(leaf), 0.0)


class DocumentTest(absltest.TestCase):

  def test_delimiter_entries_of_the_content_survive_prepended_filler(self):
    # First-layer entries are functions of the tokens' embeddings only; RoPE off, so the
    # entries themselves (not only their pre-RoPE form) must be identical.
    model = _model(num_layers=1, rope=False, boundary="delimiter", delimiters="3", max_chunk=8,
                   window=2)
    layer = DynamicAttention(model, model.attention, 0)
    embed = _normal(3, (VOCAB, E))
    rng = np.random.default_rng(0)
    content = rng.integers(7, VOCAB, size=T)  # no delimiter, no filler
    content[[2, 9, 15, 20]] = 3
    k = 5
    rows = np.stack([np.concatenate([content, rng.integers(7, VOCAB, size=k)]),
                     np.concatenate([rng.integers(4, 7, size=k), content])])  # filler 4..6
    tok = jnp.asarray(rows)
    ctx = AttentionContext(tok, jnp.broadcast_to(jnp.arange(T + k), tok.shape),
                           jnp.zeros_like(tok))
    params = _random_params(lambda key: layer.init(key, embed[tok], ctx, {}))
    _, state = jax.jit(lambda p: layer.apply({"params": p}, embed[tok], ctx, {},
                                             mutable=["intermediates"]))(params)
    ends = np.asarray(state["intermediates"]["entry_ends"][0])
    entries = np.asarray(state["intermediates"]["entries"][0]["kv"])
    keep0 = (ends[0] > 2) & (ends[0] < T)
    keep1 = (ends[1] > 2 + k) & (ends[1] < T + k)
    self.assertEqual(keep0.sum(), 3)
    np.testing.assert_array_equal(ends[0][keep0] + k, ends[1][keep1])
    np.testing.assert_array_equal(entries[0][keep0], entries[1][keep1])


class RouterModelTest(absltest.TestCase):
  """A two-layer router model (boundary_group 0), its forward pass compiled once."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model = _model(boundary="router", min_chunk=2, max_chunk=6, window=3, key_shift=2,
                       ratio_loss_weight=0.5)
    cls.net = Transformer(cls.model)
    cls.params = _random_params(cls.net.init, _tokens(0))
    cls.forward = staticmethod(jax.jit(lambda params, tokens: cls.net.apply(
        {"params": params}, tokens, mutable=AUX_COLLECTIONS + ("intermediates",))))

  def test_output_at_t_never_depends_on_later_tokens(self):
    tokens = _tokens(2)
    base, _ = self.forward(self.params, tokens)
    for t0 in (3, 11, 20):
      later = tokens.at[:, t0 + 1:].set((tokens[:, t0 + 1:] + 5) % VOCAB)
      logits, _ = self.forward(self.params, later)
      np.testing.assert_array_equal(np.asarray(logits)[:, :t0 + 1], np.asarray(base)[:, :t0 + 1])

  def test_layers_of_a_group_pool_the_same_chunks(self):
    _, state = self.forward(self.params, _tokens(3))
    ends = [np.asarray(state["intermediates"][f"block_{i}"]["attn"]["entry_ends"][0])
            for i in range(2)]
    np.testing.assert_array_equal(ends[0], ends[1])
    self.assertGreater((ends[0] < T).sum(), 4)

  def test_sown_ratio_loss_and_chunk_length_match_a_recomputation(self):
    tokens = _tokens(5)
    _, state = self.forward(self.params, tokens)
    p = self.params["block_0"]

    @jax.jit
    def recompute(tokens):  # the first layer's router reads the normalised token embeddings
      x = RMSNorm().apply({"params": p["attn_norm"]}, self.params["embedding"][tokens])
      seg = jnp.zeros_like(tokens)
      probs = chunking.BoundaryRouter().apply({"params": p["attn"]["router"]}, x, seg)
      # The default 'start' rule: p_t >= 1/2 ends the chunk at t - 1.
      proposals = jnp.pad(chunking.hard_proposals(probs)[:, 1:], ((0, 0), (0, 1)))
      ends = chunking.enforce_lengths(proposals, seg, min_chunk=2, max_chunk=6)
      # G counts p only where it decided a flag (p[t] decides the flag at t - 1).
      decided = chunking.decided_probs(probs, ends, seg, min_chunk=2, max_chunk=6, delay=1)
      return ends, chunking.ratio_loss(ends, decided, 4)

    ends, ratio = recompute(tokens)
    sown = state["aux_loss"]["block_0"]["attn"]["ratio_loss"][0]
    np.testing.assert_allclose(float(sown), 0.5 * float(ratio), rtol=1e-5)
    measured = state["aux_metrics"]["block_0"]["attn"]["mean_chunk_len"][0]
    self.assertAlmostEqual(float(measured), ends.size / float(ends.sum()), places=4)
    self.assertEqual(sorted(state["aux_loss"]), ["block_0"])  # computed once for the group
    sown_ends = state["intermediates"]["block_0"]["attn"]["end_flags"][0]
    np.testing.assert_array_equal(np.asarray(sown_ends), np.asarray(ends))


class DecodeTest(parameterized.TestCase):

  @parameterized.named_parameters(
      # Layer 0 owns the router boundaries ('start' rule), layer 1 reads them from `shared`.
      ("router_shared_by_two_layers", dict(boundary="router", min_chunk=2, max_chunk=6, window=3,
                                           sink=True, key_shift=2), 5),
      # Each layer its own rule: delimiter (mean pooling, separate k/v, no window), fixed chunks
      # with an offset, the router's 'end' rule (the base fields hold the delimiter ids, which
      # contain commas).
      ("delimiter_fixed_router_end", dict(
          num_layers=3, boundary="delimiter", delimiters=DELIMS, max_chunk=4,
          layer_pattern=("pooling=mean,shared_kv=false,window=0;"
                         "boundary=fixed,chunk_offset=1,pooling=gated_no_bias,window=4;"
                         "boundary=router,router_rule=end,window=2")), 0),
      ("deepseek_v4_layout_delimiter", dict(
          boundary="delimiter", delimiters=DELIMS, max_chunk=4, window=3, sink=True,
          layout="deepseek_v4", query_rank=16, output_groups=2, output_rank=8), 5),
  )
  def test_decode_matches_forward(self, attn, prompt):
    model = _model(**attn)
    net = Transformer(model)
    tokens = _tokens(6)
    params = _random_params(net.init, tokens, scale=0.2)
    full = jax.jit(lambda p, tok: net.apply({"params": p}, tok))(params, tokens)
    if prompt:
      logits, cache = decode.prefill(net, params, tokens[:, :prompt], T)
      steps = [logits]
    else:  # from an empty cache, token by token
      cache, steps = decode.init_cache(model, tokens.shape[0], T), []
    for i in range(prompt, T):
      step_logits, cache = decode.step(net, params, cache, tokens[:, i:i + 1])
      steps.append(step_logits[:, None])
    np.testing.assert_allclose(np.asarray(jnp.concatenate(steps, axis=1)), np.asarray(full),
                               atol=1e-5, rtol=1e-5)
    for layer in range(2):
      state = cache[f"block_{layer}"]["attn"]["state"]
      self.assertGreater(int(state["num_entries"].min()), 2)  # chunks closed while decoding


class SharedBoundariesTest(parameterized.TestCase):

  @parameterized.parameters((0, ["block_0"]), (2, ["block_0", "block_2"]))
  def test_router_is_computed_once_per_group_of_layers(self, group, owners):
    model = _model(num_layers=3, boundary="router", min_chunk=1, max_chunk=8,
                   boundary_group=group, window=2)
    net = Transformer(model)
    tokens = _tokens(5)
    params = meta.unbox(jax.eval_shape(net.init, jax.random.key(0), tokens)["params"])
    blocks = [b for b in params if b.startswith("block_")]
    self.assertEqual(sorted(b for b in blocks if "router" in params[b]["attn"]), owners)
    _, aux = jax.eval_shape(lambda p: net.apply({"params": p}, tokens, mutable=AUX_COLLECTIONS),
                            params)
    self.assertEqual(sorted(aux["aux_loss"]), owners)
    self.assertEqual(sorted(aux["aux_metrics"]), owners)

  def test_delimiter_rule_sows_its_chunk_length_and_no_loss(self):
    net = Transformer(_model(boundary="delimiter", delimiters=DELIMS, max_chunk=5, window=2))
    tokens = _tokens(7)
    params = meta.unbox(jax.eval_shape(net.init, jax.random.key(0), tokens)["params"])
    _, aux = jax.eval_shape(lambda p: net.apply({"params": p}, tokens, mutable=AUX_COLLECTIONS),
                            params)
    self.assertNotIn("aux_loss", aux)
    self.assertEqual(sorted(aux["aux_metrics"]), ["block_0"])


if __name__ == "__main__":
  absltest.main()
