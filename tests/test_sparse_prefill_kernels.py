"""kernels.block_sparse_attention: every implementation (XLA query blocks, Pallas Triton and
Mosaic in interpret mode) equals dense attention masked to the index set, built here in numpy
from the definition; the Pallas kernels never read a block their index does not list."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels

IMPLEMENTATIONS = ["xla", "pallas_gpu", "pallas_tpu"]


def _case(seed, b=2, t=100, h=4, kh=2, d=8, block=16, slots=3, columns=5, never=()):
  """Random q/k/v and a random index: the diagonal block plus up to slots - 1 earlier blocks,
  distinct columns kept by random query blocks; no block or column in the blocks ``never``
  (those query blocks read block 0 instead of their diagonal)."""
  rng = np.random.default_rng(seed)
  n = -(-t // block)
  q, k, v = (rng.normal(size=s).astype(np.float32) for s in
             ((b, t, h, d), (b, t, kh, d), (b, t, kh, d)))
  blocks = np.full((b, h, n, slots), 7, np.int32)  # past the count: ignored, whatever it holds
  counts = np.zeros((b, h, n), np.int32)
  for r in range(b):
    for head in range(h):
      for i in range(n):
        earlier = [j for j in rng.permutation(i) if j not in never][:slots - 1]
        listed = ([0] if i in never else [i]) + [j for j in earlier if j]
        blocks[r, head, i, :len(listed)] = listed
        counts[r, head, i] = len(listed)
  allowed = np.array([s for s in range(t) if s // block not in never])
  cols = np.stack([np.stack([rng.permutation(allowed)[:columns] for _ in range(h)])
                   for _ in range(b)]).astype(np.int32)
  keep = rng.random((b, h, n, columns)) < 0.7
  return [q, k, v, blocks, counts, cols, keep], block


def _numpy_attention(q, k, v, blocks, counts, cols, keep, block):
  b, t, h, d = q.shape
  g = h // k.shape[2]
  out = np.zeros_like(q)
  for r in range(b):
    for head in range(h):
      for i in range(t):
        n = i // block
        listed = set(blocks[r, head, n, :counts[r, head, n]].tolist())
        seen = {s for s in range(i + 1) if s // block in listed}
        kept = cols[r, head][keep[r, head, n]]
        seen |= {int(c) for c in kept if c <= i}
        s = np.array(sorted(seen))
        logits = k[r, s, head // g] @ q[r, i, head] / np.sqrt(d)
        p = np.exp(logits - logits.max())
        out[r, i, head] = (p / p.sum()) @ v[r, s, head // g]
  return out


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_every_implementation_equals_numpy_attention_masked_to_the_index(implementation):
  args, block = _case(0)
  got = kernels.block_sparse_attention(*map(jnp.asarray, args), block=block,
                                       implementation=implementation, interpret=True)
  np.testing.assert_allclose(np.asarray(got), _numpy_attention(*args, block), atol=2e-6)


def test_the_dense_oracle_equals_numpy_attention_masked_to_the_index():
  args, block = _case(1, b=1, t=40, h=2, kh=1)
  got = kernels.block_sparse_dense(*map(jnp.asarray, args), block=block)
  np.testing.assert_allclose(np.asarray(got), _numpy_attention(*args, block), atol=2e-6)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_column_inside_a_listed_block_counts_once(implementation):
  args, block = _case(2, b=1, t=64, h=2, kh=2, columns=1)
  q, k, v, blocks, counts, cols, keep = args
  cols[:] = 5  # in block 0 ...
  keep[:] = True
  blocks[:, :, :, 1] = 0  # ... which every query block from 1 on lists
  counts[:, :, 1:] = 2
  blocks[:, :, 0, 0], counts[:, :, 0] = 0, 1
  got = kernels.block_sparse_attention(*map(jnp.asarray, args), block=block,
                                       implementation=implementation, interpret=True)
  np.testing.assert_allclose(np.asarray(got), _numpy_attention(*args, block), atol=2e-6)


@pytest.mark.parametrize("implementation", ["pallas_gpu", "pallas_tpu"])
def test_the_kernels_never_read_an_unlisted_block(implementation):
  # NaN in the keys and values of a block no query block lists: any load that reaches it
  # (even masked: 0 * NaN = NaN in p @ v) poisons the output.
  args, block = _case(3, t=96, never=(2,))
  expected = _numpy_attention(*args, block)
  for x in args[1:3]:
    x[:, 2 * block:3 * block] = np.nan
  got = kernels.block_sparse_attention(*map(jnp.asarray, args), block=block,
                                       implementation=implementation, interpret=True)
  np.testing.assert_allclose(np.asarray(got), expected, atol=2e-6)


@pytest.mark.parametrize("implementation,platform,target", [
    ("pallas_gpu", "cuda", "__gpu$xla.gpu.triton"), ("pallas_tpu", "tpu", "tpu_custom_call")])
@pytest.mark.parametrize("columns", [0, 100])
def test_the_kernels_lower_at_prefill_shapes(implementation, platform, target, columns):
  b, t, h, kh, d, block, slots = 1, 1024, 4, 1, 128, 64, 4
  n = t // block
  z = lambda *s, dtype=jnp.bfloat16: jnp.zeros(s, dtype)
  fn = lambda *a: kernels.block_sparse_attention(*a, block=block, implementation=implementation)
  text = jax.jit(fn).trace(
      z(b, t, h, d), z(b, t, kh, d), z(b, t, kh, d), z(b, h, n, slots, dtype=jnp.int32),
      z(b, h, n, dtype=jnp.int32), z(b, h, columns, dtype=jnp.int32),
      z(b, h, n, columns, dtype=bool)).lower(lowering_platforms=(platform,)).as_text()
  assert target in text
  assert set(re.findall(r'(?:kernel_)?name = "(block_sparse[\w.]*)"', text)) == {
      "block_sparse_fwd" if implementation == "pallas_gpu" else "block_sparse_fwd_tpu"}
