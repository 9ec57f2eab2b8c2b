"""Packed-layout inputs and naive oracles shared by the kernel tests (numpy loops, no tricks)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import kernels as kernels_lib
from kernels import layout

_structure = jax.jit(layout.chunk_structure, static_argnums=2)


def segment_ids(rng, b, t, docs):
  """docs contiguous documents per row with random lengths >= 1 and distinct ids."""
  out = np.zeros((b, t), np.int32)
  for i in range(b):
    cuts = np.sort(rng.choice(np.arange(1, t), size=docs - 1, replace=False)) if docs > 1 else []
    out[i] = np.searchsorted(np.asarray(cuts), np.arange(t), side="right") + 3 * i
  return out


def end_flags(rng, seg, m):
  """Fixed chunks of m tokens restarting at each document, or random ends if m == 'dynamic'."""
  b, t = seg.shape
  ends = np.zeros((b, t), bool)
  for i in range(b):
    pos = 0
    for j in range(t):
      if j > 0 and seg[i, j] != seg[i, j - 1]:
        pos = 0
      ends[i, j] = rng.random() < 0.3 if m == "dynamic" else (pos + 1) % m == 0
      pos += 1
  return ends


def attention_case(seed, *, b=1, t=24, h=2, kh=1, d=16, m=4, docs=2, window=5, capacity=None,
                   dtype=jnp.float32, sink=False):
  rng = np.random.default_rng(seed)
  seg = segment_ids(rng, b, t, docs)
  ends = end_flags(rng, seg, m)
  capacity = capacity or t
  _, _, entry_ends, entry_seg, _, _ = _structure(jnp.asarray(ends), jnp.asarray(seg), capacity)
  c = capacity
  f = lambda *shape: jnp.asarray(rng.standard_normal(shape), dtype)
  args = (f(b, t, h, d), f(b, t, kh, d), f(b, t, kh, d), jnp.asarray(seg), f(b, c, kh, d),
          f(b, c, kh, d), entry_ends, entry_seg)
  sink_h = jnp.asarray(rng.standard_normal(h), jnp.float32) if sink else None
  return args, dict(window=window, sink_H=sink_h)


def attention_oracle(q, k, v, seg, ek, ev, eends, eseg, *, window, sink_H=None, scale=None):
  """Loops over every query, key and entry: the independent check of kernels.dense_attention
  (the oracle every other test uses). Segment ids are compared as given (use run indices)."""
  q, k, v, ek, ev = (np.asarray(x, np.float64) for x in (q, k, v, ek, ev))
  seg, eends, eseg = np.asarray(seg), np.asarray(eends), np.asarray(eseg)
  b, t, h, d = q.shape
  g = h // k.shape[2]
  scale = d**-0.5 if scale is None else scale
  out = np.zeros_like(q)
  for i in range(b):
    for tt in range(t):
      for hh in range(h):
        kv = hh // g
        logits, vals = [], []
        for s in range(t):
          if tt - window < s <= tt and seg[i, s] == seg[i, tt]:
            logits.append(q[i, tt, hh] @ k[i, s, kv] * scale)
            vals.append(v[i, s, kv])
        for c in range(ek.shape[1]):
          if eends[i, c] <= tt and eseg[i, c] == seg[i, tt]:
            logits.append(q[i, tt, hh] @ ek[i, c, kv] * scale)
            vals.append(ev[i, c, kv])
        if sink_H is not None:
          logits.append(float(sink_H[hh]))
          vals.append(np.zeros(d))
        if logits:
          w = np.exp(np.asarray(logits) - max(logits))
          out[i, tt, hh] = (w / w.sum()) @ np.asarray(vals)
  return out


def pool_oracle(values, logits, ends, seg, capacity, slot_bias=None):
  """Walks each row token by token, building chunks by the rules in kernels.layout."""
  values, logits = np.asarray(values, np.float64), np.asarray(logits, np.float64)
  ends, seg = np.asarray(ends), np.asarray(seg)
  b, t, n = values.shape
  entries = np.zeros((b, capacity, n))
  entry_ends = np.full((b, capacity), layout.PAD_END)
  entry_seg = np.full((b, capacity), layout.PAD_SEGMENT)
  for i in range(b):
    chunk, c = [], 0
    for j in range(t):
      if j > 0 and seg[i, j] != seg[i, j - 1]:
        chunk = []  # a document start drops the open chunk
      chunk.append(j)
      if ends[i, j]:
        if c < capacity:
          z = logits[i, chunk]
          if slot_bias is not None:
            z = z + np.asarray(slot_bias, np.float64)[np.minimum(np.arange(len(chunk)),
                                                                 len(slot_bias) - 1)]
          w = np.exp(z - z.max(0))
          entries[i, c] = (w / w.sum(0) * values[i, chunk]).sum(0)
          entry_ends[i, c], entry_seg[i, c] = j, seg[i, j]
        c += 1
        chunk = []
  return entries, entry_ends, entry_seg


def decode_oracle(q, wk, wv, wvalid, ek, ev, num_entries, sink_H=None, entry_visible=None):
  """Loops over (row, head): window slots with wvalid, entries c < num_entries[row] with
  entry_visible[row, c, kv head] (when given), the sink; one softmax."""
  q, wk, wv, ek, ev = (np.asarray(x, np.float64) for x in (q, wk, wv, ek, ev))
  if entry_visible is None:
    entry_visible = np.ones(ek.shape[:3], bool)
  b, h, d = q.shape
  g = h // wk.shape[2]
  out = np.zeros_like(q)
  for i in range(b):
    for hh in range(h):
      kv = hh // g
      logits = [q[i, hh] @ wk[i, w, kv] / np.sqrt(d) for w in range(wk.shape[1]) if wvalid[i, w]]
      vals = [wv[i, w, kv] for w in range(wk.shape[1]) if wvalid[i, w]]
      seen = [c for c in range(int(num_entries[i])) if entry_visible[i, c, kv]]
      logits += [q[i, hh] @ ek[i, c, kv] / np.sqrt(d) for c in seen]
      vals += [ev[i, c, kv] for c in seen]
      if sink_H is not None:
        logits.append(float(sink_H[hh]))
        vals.append(np.zeros(d))
      if logits:
        w = np.exp(np.asarray(logits) - max(logits))
        out[i, hh] = (w / w.sum()) @ np.asarray(vals)
  return out


@functools.cache
def attention_with_grads(implementation, window, block_sizes, interpret=True):
  """jit(q, k, v, seg, ek, ev, ends, eseg, sink, cotangent) -> (o, grads of <o, cotangent>)."""

  def run(q, k, v, seg, ek, ev, ends, eseg, sink, ct):
    def loss(q, k, v, ek, ev, sink):
      o = kernels_lib.chunk_attention(q, k, v, seg, ek, ev, ends, eseg, window=window,
                                      sink_H=sink, implementation=implementation,
                                      interpret=interpret, block_sizes=block_sizes)
      return jnp.sum(o.astype(jnp.float32) * ct), o
    (_, o), grads = jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4, 5), has_aux=True)(
        q, k, v, ek, ev, sink)
    return o, grads

  return jax.jit(run)
