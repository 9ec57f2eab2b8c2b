"""Pieces shared by the Pallas TPU (Mosaic) attention kernels (``attention_tpu``,
``block_sparse_tpu``): the vreg shape, float32-accumulating dots, and the online softmax over
VMEM scratch (running max and sum kept lane-broadcast, bq x 128, as Mosaic lays them out)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

F32 = jnp.float32
LANES = 128
SUBLANES = 8
NT = (((1,), (1,)), ((), ()))  # a @ b.T
NN = (((1,), (0,)), ((), ()))  # a @ b


def clamp_step(step, n):
  """step clamped to [0, n - 1] (a grid step past a range repeats its last block; n = 0 reads
  block 0). lax min/max only: jnp's // and clip lower through ops Mosaic handles per device
  kind."""
  return jnp.maximum(jnp.minimum(step, n - 1), 0)


def dot(a, b, dims):
  return jax.lax.dot_general(a, b, dims, preferred_element_type=F32)


def init_softmax(m_sc, l_sc, acc_sc, sink=-jnp.inf):
  """Scratch for a new query block; a finite ``sink`` logit seeds the max (its value is zero,
  so it only adds 1 to the sum)."""
  m_sc[...] = jnp.full(m_sc.shape, sink, F32)
  l_sc[...] = jnp.full(l_sc.shape, jnp.where(sink == -jnp.inf, 0.0, 1.0), F32)
  acc_sc[...] = jnp.zeros(acc_sc.shape, F32)


def online_update(m_sc, l_sc, acc_sc, s, mask, v):
  """One block of scores ``s`` (masked by ``mask``; None: every score visible) and values
  ``v`` into the scratch."""
  if mask is not None:
    s = jnp.where(mask, s, -jnp.inf)
  m_prev, l_prev = m_sc[...], l_sc[...]
  m_new = jnp.maximum(m_prev, jnp.max(s, axis=1)[:, None])
  m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
  alpha = jnp.exp(m_prev - m_safe)
  p = jnp.exp(s - m_safe[:, :1])
  l_sc[...] = alpha * l_prev + jnp.sum(p, axis=1)[:, None]
  m_sc[...] = m_new
  acc_sc[...] = alpha[:, :1] * acc_sc[...] + dot(p.astype(v.dtype), v, NN)
