"""Dynamic chunking: end flags, predictors, ratio loss and packed layouts (chunkformer.chunking)."""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

import kernels
from chunkformer import chunking
from chunkformer.chunking import shift_probe
from chunkformer.config import AttentionConfig, Config, ConfigError, ModelConfig, from_dict

_enforce = jax.jit(chunking.enforce_lengths, static_argnames=("min_chunk", "max_chunk"))


_layout = jax.jit(chunking.packed_layout, static_argnums=2)


def _normal(seed, shape):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _router_params(e, seed, noise=0.5):
  """BoundaryRouter weights: identity plus noise (a trained-looking, non-special router)."""
  return {"params": {name: jnp.eye(e) + noise * _normal(seed + i, (e, e))
                     for i, name in enumerate(("w_q", "w_k"))}}


@jax.jit
def _pool(values, logits, ends, seg, bias):
  capacity = 64
  entries, entry_ends, _ = kernels.segment_pool(values, logits, ends, seg, capacity=capacity,
                                                slot_bias_SxN=bias)
  return entries, entry_ends, chunking.packed_layout(ends, seg, capacity).entry_starts_BxC


def _documents(rng, b, t, docs):
  seg = np.zeros((b, t), np.int32)
  for i in range(b):
    cuts = np.sort(rng.choice(np.arange(1, t), size=docs - 1, replace=False))
    seg[i] = np.searchsorted(cuts, np.arange(t), side="right")
  return seg


def _enforce_loop(proposals, seg, min_chunk, max_chunk):
  """The length rules written as the obvious sequential loop."""
  ends = np.zeros(proposals.shape, bool)
  for b in range(proposals.shape[0]):
    open_len = 0
    for t in range(proposals.shape[1]):
      if t > 0 and seg[b, t] != seg[b, t - 1]:
        open_len = 0
      open_len += 1
      if (proposals[b, t] and open_len >= min_chunk) or open_len >= max_chunk:
        ends[b, t] = True
        open_len = 0
  return ends


def _closed_chunks(ends, seg):
  """(start, end) token ranges of the closed chunks of one row."""
  chunks, start = [], 0
  for t in range(len(ends)):
    if t > 0 and seg[t] != seg[t - 1]:
      start = t
    if ends[t]:
      chunks.append((start, t))
      start = t + 1
  return chunks


class EndFlagTest(parameterized.TestCase):

  @parameterized.parameters((1, 5), (1, 50), (2, 6), (3, 3))
  def test_enforced_lengths_match_the_sequential_rule(self, min_chunk, max_chunk):
    rng = np.random.default_rng(min_chunk * 100 + max_chunk)
    proposals = rng.random((4, 50)) < 0.35
    seg = _documents(rng, 4, 50, 3)
    ends = _enforce(jnp.asarray(proposals), jnp.asarray(seg),
                                    min_chunk=min_chunk, max_chunk=max_chunk)
    np.testing.assert_array_equal(np.asarray(ends),
                                  _enforce_loop(proposals, seg, min_chunk, max_chunk))

  def test_closed_chunks_hold_between_min_and_max_tokens_of_one_document(self):
    rng = np.random.default_rng(1)
    seg = _documents(rng, 3, 64, 4)
    for density in (0.0, 0.3, 1.0):
      proposals = rng.random((3, 64)) < density
      ends = np.asarray(_enforce(jnp.asarray(proposals), jnp.asarray(seg),
                                                 min_chunk=3, max_chunk=7))
      for b in range(3):
        for start, end in _closed_chunks(ends[b], seg[b]):
          self.assertBetween(end - start + 1, 3, 7)
          self.assertEqual(seg[b, start], seg[b, end])

  @parameterized.parameters((4, 0), (4, 1), (3, 2), (8, 5))
  def test_fixed_flags_close_every_m_tokens_from_each_document_start(self, m, offset):
    seg = np.array([[0] * 11 + [1] * 13])
    pos = np.concatenate([np.arange(11), np.arange(13)])[None]
    ends = np.asarray(chunking.fixed_end_flags(jnp.asarray(pos), m, offset))
    expected = (pos + 1 + offset) % m == 0
    np.testing.assert_array_equal(ends, expected)
    shortest = min(e - s + 1 for s, e in _closed_chunks(ends[0], seg[0]))
    self.assertEqual(shortest, chunking.shortest_chunk(m, offset))

  def test_mean_chunk_length_of_fixed_chunks_is_m(self):
    pos = jnp.broadcast_to(jnp.arange(64), (2, 64))
    self.assertEqual(float(chunking.mean_chunk_length(chunking.fixed_end_flags(pos, 4))), 4.0)


class CausalityTest(parameterized.TestCase):

  def _router(self, e=16):
    router = chunking.BoundaryRouter()
    x = _normal(0, (2, 32, e))
    seg = jnp.asarray(_documents(np.random.default_rng(0), 2, 32, 2))
    params = _router_params(e, 1)
    return router, params, x, seg

  def test_router_flags_never_depend_on_later_tokens(self):
    router, params, x, seg = self._router()
    noise = _normal(3, x.shape)

    @jax.jit
    def flags(inp):
      p = router.apply(params, inp, seg)
      return p, _enforce(chunking.hard_proposals(p), seg, min_chunk=2, max_chunk=5)

    p1, e1 = flags(x)
    for t0 in (0, 7, 19, 30):
      p2, e2 = flags(x.at[:, t0 + 1:].add(3.0 * noise[:, t0 + 1:]))
      np.testing.assert_array_equal(p1[:, :t0 + 1], p2[:, :t0 + 1])
      np.testing.assert_array_equal(e1[:, :t0 + 1], e2[:, :t0 + 1])
      self.assertFalse(np.array_equal(p1, p2))  # the perturbation did reach later tokens

  def test_router_probability_has_zero_gradient_from_later_tokens(self):
    router, params, x, seg = self._router()
    weights = _normal(5, seg.shape)

    @jax.jit
    def grad_of_prefix(t0):  # d/dx of a random combination of p_0 .. p_t0
      prefix = weights * (jnp.arange(seg.shape[1]) <= t0)
      return jax.grad(lambda inp: jnp.sum(router.apply(params, inp, seg) * prefix))(x)

    for t0 in (1, 9, 20, 30):  # (p_0 = 0 at the document start: no gradient at all)
      influence = np.abs(np.asarray(grad_of_prefix(t0))).sum(axis=(0, 2))  # per input token
      np.testing.assert_array_equal(influence[t0 + 1:], 0.0)
      self.assertGreater(influence[t0], 0.0)  # ... while x_t0 itself does count

  def test_router_at_identity_init_is_cosine_dissimilarity_and_zero_at_document_starts(self):
    router = chunking.BoundaryRouter()
    x = _normal(0, (1, 12, 8))
    seg = jnp.asarray([[0] * 5 + [1] * 7])
    p = router.apply(router.init(jax.random.key(1), x, seg), x, seg)
    a, b = np.asarray(x[0, 1:]), np.asarray(x[0, :-1])
    cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    expected = np.concatenate([[0.0], (1 - cos) / 2])
    expected[5] = 0.0
    np.testing.assert_allclose(np.asarray(p[0]), expected, atol=1e-5)

  def test_delimiter_flags_never_depend_on_later_tokens(self):
    rng = np.random.default_rng(0)
    seg = jnp.zeros((2, 32), jnp.int32)
    flags = jax.jit(lambda tok: _enforce(chunking.delimiter_proposals(tok, (3, 4)), seg,
                                         min_chunk=1, max_chunk=6))
    tokens = rng.integers(3, 20, size=(2, 32))
    for t0 in (0, 11, 25):
      later = tokens.copy()
      later[:, t0 + 1:] = rng.integers(3, 20, size=later[:, t0 + 1:].shape)
      np.testing.assert_array_equal(np.asarray(flags(tokens))[:, :t0 + 1],
                                    np.asarray(flags(later))[:, :t0 + 1])


class ShiftInvarianceTest(absltest.TestCase):
  """Prepending k filler tokens must not move the content's boundaries or change its entries.

  "Entries unchanged" means: for every chunk that closes after the content's first boundary
  (before it, the open chunk may have absorbed filler), the pooled entry before RoPE is
  identical and its start position is shifted by exactly k, so after RoPE at the chunk start it
  is the same vector rotated by k, exactly what the (equally shifted) queries expect.
  Values and gate logits here are functions of the token alone, as at the first layer.
  Row k of a batch holds k filler tokens, the content, then unrelated tail tokens (k = 0 is the
  unshifted content), so all shifts k = 1 .. 2M run in one call.
  """

  M = 4
  DELIMITERS = (3,)  # one of the kv task's four filler ids, as in configs/kv_delimiter.py
  CONTENT = 60

  def _rows(self, rng, content):
    shifts = 2 * self.M
    rows = []
    for k in range(shifts + 1):
      filler = rng.integers(3, 7, size=k)  # kv filler ids 3..6
      tail = rng.integers(3, 32, size=shifts - k)
      rows.append(np.concatenate([filler, content, tail]))
    return jnp.asarray(np.stack(rows))

  def _check_all_shifts(self, propose, content, rng, max_chunk):
    tokens = self._rows(rng, content)
    seg = jnp.zeros(tokens.shape, jnp.int32)
    ends = _enforce(propose(tokens), seg, min_chunk=1, max_chunk=max_chunk)
    table = _normal(0, (32, 2, 6))
    bias = _normal(1, (8, 6))
    entries, entry_ends, starts = _pool(table[tokens, 0], table[tokens, 1], ends, seg, bias)
    ends, entries, entry_ends, starts = map(np.asarray, (ends, entries, entry_ends, starts))
    n = self.CONTENT
    firsts = []
    for k in range(1, 2 * self.M + 1):
      e_orig, e_shift = ends[0, :n], ends[k, k:k + n]
      first = int(np.argmax(e_orig & e_shift))  # first boundary both place in the content
      np.testing.assert_array_equal(e_orig[first:], e_shift[first:], err_msg=f"k={k}")
      keep_o = (entry_ends[0] > first) & (entry_ends[0] < n)
      keep_s = (entry_ends[k] > first + k) & (entry_ends[k] < k + n)
      self.assertGreater(keep_o.sum(), 3)
      np.testing.assert_array_equal(entries[0][keep_o], entries[k][keep_s], err_msg=f"k={k}")
      np.testing.assert_array_equal(starts[0][keep_o] + k, starts[k][keep_s], err_msg=f"k={k}")
      firsts.append(first)
    return firsts

  def test_delimiter_rule_is_exactly_shift_invariant_for_every_k_up_to_2m(self):
    rng = np.random.default_rng(0)
    content = rng.integers(3, 32, size=self.CONTENT)
    content[rng.random(self.CONTENT) < 0.15] = 3  # delimiters about as often as in kv rows
    propose = lambda tok: chunking.delimiter_proposals(tok, self.DELIMITERS)
    firsts = self._check_all_shifts(propose, content, rng, max_chunk=8)
    # Re-synchronised at the content's first delimiter, whatever the filler did.
    self.assertEqual(set(firsts), {int(np.argmax(content == 3))})

  def test_router_on_token_embeddings_is_shift_invariant_after_its_first_boundary(self):
    rng = np.random.default_rng(1)
    router = chunking.BoundaryRouter()
    embed = _normal(5, (32, 16))
    seg = jnp.zeros((2 * self.M + 1, self.CONTENT + 2 * self.M), jnp.int32)
    params = _router_params(16, 6)
    propose = jax.jit(lambda tok: chunking.hard_proposals(router.apply(params, embed[tok], seg)))
    self._check_all_shifts(propose, rng.integers(3, 32, size=self.CONTENT), rng, max_chunk=12)


class ShiftProbeTest(absltest.TestCase):

  def test_insert_filler_shifts_the_content_and_keeps_the_length(self):
    tokens = np.arange(10)[None] + 20
    shifted = shift_probe.insert_filler(tokens, 3, (3, 4), at=1)
    self.assertEqual(shifted.shape, tokens.shape)
    np.testing.assert_array_equal(shifted[0, 4:], tokens[0, 1:7])
    self.assertTrue(set(shifted[0, 1:4]) <= {3, 4})

  def test_agreement_counts_boundaries_on_the_same_content_token(self):
    pad = kernels.PAD_END
    original = np.array([[2, 5, 9, 13, pad]])
    shifted = np.array([[3, 7, 11, 15, pad]])  # k = 2: content ends 5, 9, 13 kept; 2 -> 1 moved
    r = shift_probe.boundary_agreement(original, shifted, k=2, seq_len=18)
    self.assertEqual((r["boundaries_both"], r["boundaries_either"]), (3, 5))
    self.assertAlmostEqual(r["unchanged"], 3 / 5)
    self.assertAlmostEqual(r["unchanged_after_resync"], 1.0)  # after the first shared end 5


class PackingTest(parameterized.TestCase):

  def _layout(self, seed=0, b=3, t=40, min_chunk=2):
    rng = np.random.default_rng(seed)
    seg = jnp.asarray(_documents(rng, b, t, 3))
    ends = _enforce(jnp.asarray(rng.random((b, t)) < 0.4), seg,
                                    min_chunk=min_chunk, max_chunk=6)
    cap = chunking.entry_capacity(t, min_chunk, 8)
    return _layout(ends, seg, cap), ends, seg

  def test_unpack_of_pack_restores_every_end_token_and_zeros_elsewhere(self):
    lay, ends, _ = self._layout()
    x = _normal(0, ends.shape + (5,))
    back = chunking.unpack(chunking.pack(x, lay), lay, ends.shape[1])
    np.testing.assert_array_equal(np.asarray(back), np.where(np.asarray(ends)[..., None], x, 0))

  def test_pack_of_unpack_restores_valid_slots_and_padding_stays_zero(self):
    lay, ends, _ = self._layout(1)
    y = _normal(1, (ends.shape[0], lay.capacity, 3))
    again = chunking.pack(chunking.unpack(y, lay, ends.shape[1]), lay)
    valid = np.asarray(lay.valid_BxC)[..., None]
    np.testing.assert_array_equal(np.asarray(again), np.where(valid, y, 0.0))
    self.assertTrue((~valid).any())  # the test does exercise padding

  def test_entries_are_ordered_by_end_and_padding_is_never_visible(self):
    lay, ends, seg = self._layout(2)
    e = np.asarray(lay.entry_ends_BxC)
    valid = np.asarray(lay.valid_BxC)
    for row, ok in zip(e, valid, strict=True):
      self.assertTrue((np.diff(row[ok]) > 0).all())
      self.assertTrue(ok[:ok.sum()].all())  # padding only after the last entry
    vis = np.asarray(lay.visibility_BxTxC(seg))
    self.assertFalse((vis & ~valid[:, None, :]).any())
    # Padding entries with arbitrary keys/values do not change the attention output.
    b, t = ends.shape
    c = lay.capacity
    q = _normal(3, (b, t, 2, 8))
    k = _normal(4, (b, t, 1, 8))
    ek = _normal(5, (b, c, 1, 8))
    garbage = jnp.where(lay.valid_BxC[..., None, None], ek, 1e3)
    attend = jax.jit(lambda entries: kernels.chunk_attention(
        q, k, k, seg, entries, entries, lay.entry_ends_BxC, lay.entry_segment_ids_BxC, window=3))
    outs = [attend(entries) for entries in (ek, garbage)]
    np.testing.assert_array_equal(np.asarray(outs[0]), np.asarray(outs[1]))

  def test_no_chunk_crosses_a_document_boundary(self):
    lay, ends, seg = self._layout(3)
    seg = np.asarray(seg)
    owner = np.asarray(lay.entry_of_token_BxT)
    for b in range(seg.shape[0]):
      for c in range(int(lay.num_entries_B[b])):
        members = np.nonzero(owner[b] == c)[0]
        self.assertLen(set(seg[b, members]), 1)
        self.assertEqual(members[0], int(lay.entry_starts_BxC[b, c]))
        self.assertEqual(members[-1], int(lay.entry_ends_BxC[b, c]))
        np.testing.assert_array_equal(members, np.arange(members[0], members[-1] + 1))

  @parameterized.parameters((1, 8), (3, 16))
  def test_capacity_never_drops_a_chunk_even_when_every_token_proposes(self, min_chunk, mult):
    t = 37
    seg = jnp.asarray(_documents(np.random.default_rng(0), 2, t, 5))
    ends = _enforce(jnp.ones((2, t), bool), seg, min_chunk=min_chunk,
                                    max_chunk=max(min_chunk, 9))
    cap = chunking.entry_capacity(t, min_chunk, mult)
    self.assertEqual(cap % mult, 0)
    lay = _layout(ends, seg, cap)
    np.testing.assert_array_equal(lay.num_entries_B, np.asarray(ends).sum(1))


class RatioLossTest(parameterized.TestCase):

  def test_value_and_gradient_match_hand_computation(self):
    ends = jnp.asarray([[1, 0, 0, 1, 0, 0, 1, 0]], bool)  # F = 3/8
    probs = jnp.asarray([[0.9, 0.1, 0.2, 0.7, 0.6, 0.3, 0.4, 0.8]])  # G = 4/8
    # N = 4: 4/3 * (3 * 3/8 * 1/2 + 5/8 * 1/2) = 4/3 * 7/8 = 7/6.
    loss, grad = jax.value_and_grad(lambda p: chunking.ratio_loss(ends, p, 4))(probs)
    self.assertAlmostEqual(float(loss), 7 / 6, places=6)
    # dL/dp_t = 1/8 * 4/3 * (3F - (1 - F)) = 1/8 * 4/3 * 1/2 = 1/12 for every token.
    np.testing.assert_allclose(np.asarray(grad), np.full((1, 8), 1 / 12), rtol=1e-6)

  def test_loss_is_one_at_the_target_ratio_whatever_the_probabilities(self):
    ends = jnp.asarray([[1, 0, 0, 0] * 4], bool)
    for g in (0.1, 0.25, 0.9):
      self.assertAlmostEqual(float(chunking.ratio_loss(ends, jnp.full((1, 16), g), 4)), 1.0,
                             places=6)

  def test_decided_probs_are_p_only_where_the_length_rules_leave_the_choice(self):
    p = jnp.linspace(0.1, 0.8, 8)[None]
    ends = jnp.asarray([[0, 1, 0, 0, 1, 0, 1, 0]], bool)  # lengths 1 2 | 1 2 3 | 1 2 | 1
    seg = jnp.zeros((1, 8), jnp.int32)
    got = chunking.decided_probs(p, ends, seg, min_chunk=2, max_chunk=3)
    want = np.where([0, 1, 0, 1, 0, 0, 1, 0], p, [0, 0, 0, 0, 1, 0, 0, 0])  # t=4: max forces
    np.testing.assert_allclose(got, want, rtol=1e-6)
    shifted = chunking.decided_probs(p, ends, seg, min_chunk=2, max_chunk=3, delay=1)
    np.testing.assert_allclose(shifted, np.where([0, 0, 1, 0, 1, 0, 0, 1], p,
                                                 [0, 0, 0, 0, 0, 1, 0, 0]), rtol=1e-6)
    grad = jax.grad(lambda q: chunking.ratio_loss(
        ends, chunking.decided_probs(q, ends, seg, min_chunk=2, max_chunk=3), 4))(p)
    np.testing.assert_array_equal(np.asarray(grad)[0] != 0, [0, 1, 0, 1, 0, 0, 1, 0])

  @parameterized.parameters(0, 1)
  def test_hard_decided_probs_are_the_end_flags(self, delay):
    # The invariant that makes F and G of the ratio loss count the same decisions.
    rng = np.random.default_rng(delay)
    seg = jnp.asarray(_documents(rng, 4, 40, 3))
    # As the router: p = 0 at a document's first token (it has no predecessor to compare).
    p = jnp.where(chunking.is_document_start(seg), 0.0, jnp.asarray(rng.random((4, 40))))
    proposals = chunking.hard_proposals(p)
    if delay:
      proposals = jnp.pad(proposals[:, 1:], ((0, 0), (0, 1)))
    ends = chunking.enforce_lengths(proposals, seg, min_chunk=3, max_chunk=6)
    hard = np.asarray(chunking.decided_probs(p, ends, seg, min_chunk=3, max_chunk=6,
                                             delay=delay)) >= 0.5
    e = np.asarray(ends)
    if delay:  # p[t] decides the flag at t - 1; nothing decides the row's last flag
      np.testing.assert_array_equal(hard[:, 1:], e[:, :-1])
    else:
      np.testing.assert_array_equal(hard, e)

  def test_straight_through_is_one_forward_and_identity_backward(self):
    p = jnp.asarray([0.2, 0.7])
    chex.assert_trees_all_equal(chunking.straight_through(p), jnp.ones(2))
    np.testing.assert_array_equal(jax.grad(lambda x: chunking.straight_through(x).sum())(p),
                                  [1.0, 1.0])


class ConfigValidationTest(parameterized.TestCase):

  def _config(self, **attn):
    base = dict(kind="dynamic", chunk_size=4, min_chunk=2, max_chunk=8)
    base.update(attn)
    return {"model": {"attention": base}}

  @parameterized.named_parameters(
      ("target_below_min", dict(chunk_size=1), "chunk_size"),
      ("target_above_max", dict(chunk_size=9), "chunk_size"),
      ("max_below_min", dict(min_chunk=5, max_chunk=4), "max_chunk"),
      ("delimiter_outside_vocab", dict(boundary="delimiter", delimiters="3,999"), "delimiters"),
      ("delimiter_rule_without_ids", dict(boundary="delimiter"), "delimiters"),
      ("capacity_too_small", dict(entry_capacity=64), "entry_capacity"),
      ("unsupported_pooling", dict(pooling="mlp"), "pooling"),
  )
  def test_bad_dynamic_settings_fail_at_validation_naming_the_field(self, attn, field):
    values = self._config(**attn)
    values["data"] = {"seq_len": 256}
    with pytest.raises(ConfigError, match=field):
      from_dict(values)

  def test_capacity_large_enough_for_the_minimum_chunk_is_accepted(self):
    values = self._config(entry_capacity=128)
    values["data"] = {"seq_len": 256}
    self.assertEqual(from_dict(values).model.attention.entry_capacity, 128)

  def test_model_alone_rejects_a_router_target_of_one(self):
    model = ModelConfig(attention=AttentionConfig(kind="dynamic", chunk_size=1, min_chunk=1,
                                                  max_chunk=4))
    with pytest.raises(ConfigError, match="chunk_size"):
      dataclasses.replace(Config(), model=model).validate()


if __name__ == "__main__":
  absltest.main()


class BoundariesTest(chex.TestCase):
  """chunking.boundaries.compute: one typed value that every consumer reads."""

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(("router", "start", 1), ("router", "end", 0), ("delimiter", "start", 0),
                            ("fixed", "start", 0))
  def test_entries_become_visible_after_the_predictors_delay(self, boundary, rule, delay):
    attn = AttentionConfig(kind="dynamic", boundary=boundary, router_rule=rule, chunk_size=3,
                           min_chunk=1, max_chunk=5, delimiters="2,5")
    b, t = 2, 24
    rng = np.random.default_rng(3)
    tokens = jnp.asarray(rng.integers(0, 8, (b, t)), jnp.int32)
    seg = jnp.asarray(np.repeat([[0] * 14 + [1] * 10], b, axis=0), jnp.int32)
    pos = jnp.asarray(np.repeat([list(range(14)) + list(range(10))], b, axis=0), jnp.int32)
    probs = jnp.asarray(rng.random((b, t)), jnp.float32) if boundary == "router" else None
    compute = self.variant(lambda *a: chunking.boundaries.compute(attn, *a))
    bounds = compute(tokens, pos, seg, probs)
    lay = bounds.layout
    valid = np.asarray(lay.valid_BxC)
    ends = np.asarray(lay.entry_ends_BxC)
    np.testing.assert_array_equal(np.asarray(lay.entry_visible_from_BxC)[valid],
                                  ends[valid] + delay)
    # The same flags as the predictor alone, packed into the capacity the kind uses.
    np.testing.assert_array_equal(
        bounds.ends_BxT, chunking.boundaries.predict_end_flags(attn, tokens, pos, seg, probs))
    self.assertEqual(lay.capacity, chunking.boundaries.capacity(attn, t))
    # Query t sees entry c iff visible_from <= t in its document (kernels.entry_visible).
    vis = np.asarray(lay.visibility_BxTxC(seg))
    query = np.arange(t)[None, :, None]
    want = ((np.asarray(lay.entry_visible_from_BxC)[:, None, :] <= query)
            & (np.asarray(lay.entry_segment_ids_BxC)[:, None, :] == np.asarray(seg)[:, :, None]))
    np.testing.assert_array_equal(vis, want)
    scale = bounds.entry_scale_BxC()
    if boundary == "router":
      np.testing.assert_allclose(np.asarray(scale)[valid], 1.0)  # straight-through: 1 forward
    else:
      self.assertIsNone(scale)
