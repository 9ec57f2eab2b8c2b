"""decode_attention with Pallas (flash-decoding): split the keys, merge by log-sum-exp.

One kernel attends the H/K query heads of a key/value head (a [G, D] query tile, so MQA reads
each key once for all heads) to one split of a key range; it returns the split's normalised
output and log-sum-exp. It runs twice: over the window ring buffer (one split, slots masked by
``window_valid``) and over the entries (``num_splits`` splits, loops bounded by
``num_entries``, so unused capacity is never read; masked per kv head by ``entry_visible``
when given). The key mask is per (row, kv head), so one kernel serves both. XLA merges the
partials and the sink.

- GPU (Triton): grid (B, K, splits), an in-kernel loop over the split's key blocks.
- TPU (Mosaic): grid (B, K, splits, steps); the key count is scalar-prefetched, the key index
  map clamps to the last needed block (no DMA past it) and ``pl.when`` skips the compute.

Not meant for training: the custom VJP recomputes through the pure-jnp reference.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

from kernels import reference
from kernels.block_sizes import DecodeBlockSizes
from kernels.padding import gpu_tile, next_power_of_2, pad_to, round_up

_F32 = jnp.float32
_NT = (((1,), (1,)), ((), ()))
_NN = (((1,), (0,)), ((), ()))


@dataclasses.dataclass(frozen=True)
class _Cfg:
  backend: str
  scale: float
  block: int  # keys per inner step
  split_len: int  # keys per split (a multiple of block)
  num_warps: int
  num_stages: int
  interpret: object


def _update(carry, s, mask, v):
  acc, m, denom = carry
  s = jnp.where(mask, s, -jnp.inf)
  m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
  m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
  alpha = jnp.exp(m - m_safe)
  p = jnp.exp(s - m_safe)
  denom = alpha * denom + jnp.sum(p, axis=1, keepdims=True)
  acc = alpha * acc + jax.lax.dot_general(p.astype(v.dtype), v, _NN, preferred_element_type=_F32)
  return acc, m_new, denom


def _finish(acc, m, denom):
  seen = denom > 0
  o = acc / jnp.where(seen, denom, 1.0)
  lse = jnp.where(seen, m + jnp.log(jnp.where(seen, denom, 1.0)), -jnp.inf)
  return o, lse


def _gpu_kernel(count_ref, q_ref, k_ref, v_ref, *refs, cfg: _Cfg):
  valid_ref, o_ref, lse_ref = refs if len(refs) == 3 else (None,) + refs
  split = pl.program_id(2)
  q = q_ref[...]
  bl = cfg.block
  lo = split * cfg.split_len
  hi = jnp.minimum(lo + cfg.split_len, count_ref[()])

  def body(j, carry):
    rows = pl.ds(j * bl, bl)
    s = jax.lax.dot_general(q, k_ref[rows, :], _NT, preferred_element_type=_F32) * cfg.scale
    pos = j * bl + jnp.arange(bl, dtype=jnp.int32)
    mask = (pos < hi)[None, :]
    if valid_ref is not None:
      mask = mask & (valid_ref[rows] != 0)[None, :]
    return _update(carry, s, mask, v_ref[rows, :])

  init = (jnp.zeros(q.shape, _F32), jnp.full((q.shape[0], 1), -jnp.inf, _F32),
          jnp.zeros((q.shape[0], 1), _F32))
  carry = jax.lax.fori_loop(jax.lax.div(lo, bl), jax.lax.div(hi + bl - 1, bl), body, init)
  o, lse = _finish(*carry)
  o_ref[...] = o
  lse_ref[...] = lse[:, 0]


def _tpu_kernel(count_ref, q_ref, k_ref, v_ref, *refs, cfg: _Cfg, steps: int):
  valid_ref, o_ref, lse_ref, m_sc, l_sc, acc_sc = refs if len(refs) == 6 else (None,) + refs
  b, split, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)
  start = (split * steps + j) * cfg.block

  @pl.when(j == 0)
  def _init():
    m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, _F32)
    l_sc[...] = jnp.zeros(l_sc.shape, _F32)
    acc_sc[...] = jnp.zeros(acc_sc.shape, _F32)

  @pl.when(start < count_ref[b])
  def _step():
    s = jax.lax.dot_general(q_ref[...], k_ref[...], _NT, preferred_element_type=_F32) * cfg.scale
    pos = start + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    mask = pos < count_ref[b]
    if valid_ref is not None:
      mask = mask & (valid_ref[...][:1, :] != 0)
    acc, m, denom = _update((acc_sc[...], m_sc[...][:, :1], l_sc[...][:, :1]), s, mask, v_ref[...])
    acc_sc[...] = acc
    m_sc[...] = jnp.broadcast_to(m, m_sc.shape)
    l_sc[...] = jnp.broadcast_to(denom, l_sc.shape)

  @pl.when(j == steps - 1)
  def _end():
    o, lse = _finish(acc_sc[...], m_sc[...][:, :1], l_sc[...][:, :1])
    o_ref[...] = o
    lse_ref[...] = jnp.broadcast_to(lse, lse_ref.shape)


def _partials(cfg: _Cfg, q, k, v, valid, count, splits):
  """q_BxKxGpxDp, k/v_BxLxKxDp, valid_BxKxL (int32 or None), count_B -> o_BxKxSxGpxDp, lse.

  Key j of kv head k is attended iff valid[k, j] (when given) and j < count.
  """
  b, kh, gp, dp = q.shape
  length = k.shape[1]
  out_shape = [jax.ShapeDtypeStruct((b, kh, splits, gp, dp), _F32),
               jax.ShapeDtypeStruct((b, kh, splits, gp, 128 if cfg.backend == "pallas_tpu"
                                     else 1), _F32)]
  if cfg.backend == "pallas_gpu":
    out_shape[1] = jax.ShapeDtypeStruct((b, kh, splits, gp), _F32)
    valid_spec = [pl.BlockSpec((None, None, length), lambda b_, h, s: (b_, h, 0))]
    o, lse = pl.pallas_call(
        functools.partial(_gpu_kernel, cfg=cfg),
        grid=(b, kh, splits),
        in_specs=[pl.BlockSpec((None,), lambda b_, h, s: (b_,)),
                  pl.BlockSpec((None, None, gp, dp), lambda b_, h, s: (b_, h, 0, 0)),
                  pl.BlockSpec((None, length, None, dp), lambda b_, h, s: (b_, 0, h, 0)),
                  pl.BlockSpec((None, length, None, dp), lambda b_, h, s: (b_, 0, h, 0))]
                 + ([] if valid is None else valid_spec),
        out_specs=[pl.BlockSpec((None, None, None, gp, dp), lambda b_, h, s: (b_, h, s, 0, 0)),
                   pl.BlockSpec((None, None, None, gp), lambda b_, h, s: (b_, h, s, 0))],
        out_shape=out_shape,
        compiler_params=pltriton.CompilerParams(num_warps=cfg.num_warps,
                                                num_stages=cfg.num_stages),
        interpret=cfg.interpret, name="decode_attention_gpu",
    )(count, q, k, v, *([] if valid is None else [valid]))
    return o, lse
  steps = cfg.split_len // cfg.block

  def key_block(b_, s, j, count):
    last = jnp.maximum(jax.lax.div(count[b_] + cfg.block - 1, cfg.block) - 1, 0)
    return jnp.minimum(s * steps + j, last)

  k_heads = jnp.swapaxes(k, 1, 2)  # B x K x L x D: Mosaic tiles the last two dimensions
  v_heads = jnp.swapaxes(v, 1, 2)
  valid_spec, valid_arg = [], []
  if valid is not None:  # sublane-broadcast, as Mosaic tiles the last two dimensions
    valid_spec = [pl.BlockSpec((None, None, 8, cfg.block),
                               lambda b_, h, s, j, count: (b_, h, 0, key_block(b_, s, j, count)))]
    valid_arg = [jnp.broadcast_to(valid[:, :, None, :], (b, kh, 8, length))]
  kv_spec = pl.BlockSpec((None, None, cfg.block, dp),
                         lambda b_, h, s, j, count: (b_, h, key_block(b_, s, j, count), 0))
  o, lse = pl.pallas_call(
      functools.partial(_tpu_kernel, cfg=cfg, steps=steps),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1,
          grid=(b, kh, splits, steps),
          in_specs=[pl.BlockSpec((None, None, gp, dp), lambda b_, h, s, j, _: (b_, h, 0, 0)),
                    kv_spec, kv_spec] + valid_spec,
          out_specs=[pl.BlockSpec((None, None, None, gp, dp),
                                  lambda b_, h, s, j, _: (b_, h, s, 0, 0)),
                     pl.BlockSpec((None, None, None, gp, 128),
                                  lambda b_, h, s, j, _: (b_, h, s, 0, 0))],
          scratch_shapes=[pltpu.VMEM((gp, 128), _F32), pltpu.VMEM((gp, 128), _F32),
                          pltpu.VMEM((gp, dp), _F32)]),
      out_shape=out_shape,
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
      interpret=cfg.interpret, name="decode_attention_tpu",
  )(count, q, k_heads, v_heads, *valid_arg)
  return o, lse[..., 0]


def _forward(q, wk, wv, wvalid, ek, ev, num_entries, sink, evisible, *, scale, backend,
             interpret, num_splits, block_sizes):
  b, h, d = q.shape
  kh = wk.shape[2]
  g = h // kh
  w, c = wk.shape[1], ek.shape[1]
  if backend == "pallas_gpu":
    gp, dp = max(16, next_power_of_2(g)), max(16, next_power_of_2(d))
    bw, bc = gpu_tile(block_sizes.block_w, w), gpu_tile(block_sizes.block_c, c)
  else:
    gp, dp = round_up(g, 8), d
    bw = min(block_sizes.block_w, round_up(w, 8))
    bc = min(block_sizes.block_c, round_up(max(c, 1), 8))
    # The window mask tiles W on lanes: one tile holding all of W, or multiples of 128.
    if bw < w and bw % 128:
      raise ValueError(f"pallas_tpu decode: block_w must be a multiple of 128 when it is shorter "
                       f"than the window, got block_w={bw} for W={w}")
    if bc % 8:
      raise ValueError(f"pallas_tpu decode: block_c must be a multiple of 8, got {bc}")
  q_p = pad_to(pad_to(q.reshape(b, kh, g, d), 2, gp), 3, dp)
  make = lambda block, split_len: _Cfg(
      backend=backend, scale=scale, block=block, split_len=split_len,
      num_warps=block_sizes.num_warps, num_stages=block_sizes.num_stages, interpret=interpret)
  pad_kv = lambda x, n: pad_to(pad_to(x, 1, n), 3, dp)
  # An empty window (W = 0) or entry capacity (C = 0) has no split to run: a zero-length
  # operand cannot be tiled, and it would only contribute a -inf log-sum-exp.
  partials = []
  if w:
    wp = round_up(w, bw)
    partials.append(_partials(make(bw, wp), q_p, pad_kv(wk, wp), pad_kv(wv, wp),
                              jnp.broadcast_to(pad_to(wvalid.astype(jnp.int32), 1, wp)[:, None],
                                               (b, kh, wp)),
                              jnp.full((b,), w, jnp.int32), 1))
  if c:
    split_c = round_up(max(-(-c // num_splits), 1), bc)
    cp = split_c * num_splits
    evalid = None if evisible is None else pad_to(
        jnp.swapaxes(evisible, 1, 2).astype(jnp.int32), 2, cp)  # B x K x C
    partials.append(_partials(make(bc, split_c), q_p, pad_kv(ek, cp), pad_kv(ev, cp), evalid,
                              jnp.minimum(num_entries, c).astype(jnp.int32), num_splits))
  if not partials:  # nothing to see: the contract's zeros (the sink's value is zero)
    return jnp.zeros_like(q)
  o_all = jnp.concatenate([o for o, _ in partials], axis=2)[:, :, :, :g, :d]  # B x K x S x G x D
  lse_all = jnp.concatenate([lse for _, lse in partials], axis=2)[:, :, :, :g]  # B x K x S x G
  m = jnp.max(lse_all, axis=2)
  if sink is not None:
    sink_kg = sink.astype(_F32).reshape(kh, g)[None]
    m = jnp.maximum(m, sink_kg)
  m = jnp.where(jnp.isfinite(m), m, 0.0)
  wts = jnp.exp(lse_all - m[:, :, None])
  denom = jnp.sum(wts, axis=2)
  if sink is not None:
    denom = denom + jnp.exp(sink_kg - m)
  o = jnp.einsum("bksg,bksgd->bkgd", wts, o_all) / jnp.where(denom > 0, denom, 1.0)[..., None]
  return o.reshape(b, h, d).astype(q.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(9, 10, 11, 12, 13))
def _decode(q, wk, wv, wvalid, ek, ev, num_entries, sink, evisible, scale, backend, interpret,
            num_splits, block_sizes):
  return _forward(q, wk, wv, wvalid, ek, ev, num_entries, sink, evisible, scale=scale,
                  backend=backend, interpret=interpret, num_splits=num_splits,
                  block_sizes=block_sizes)


def _decode_fwd(q, wk, wv, wvalid, ek, ev, num_entries, sink, evisible, scale, backend,
                interpret, num_splits, block_sizes):
  o = _decode(q, wk, wv, wvalid, ek, ev, num_entries, sink, evisible, scale, backend, interpret,
              num_splits, block_sizes)
  return o, (q, wk, wv, wvalid, ek, ev, num_entries, sink, evisible)


def _decode_bwd(scale, backend, interpret, num_splits, block_sizes, res, do):
  del backend, interpret, num_splits, block_sizes
  q, wk, wv, wvalid, ek, ev, num_entries, sink, evisible = res
  ref = lambda q, wk, wv, ek, ev, sink: reference.decode_attention_reference(
      q, wk, wv, wvalid, ek, ev, num_entries, sink_H=sink, scale=scale,
      entry_visible_BxCxK=evisible)
  dq, dwk, dwv, dek, dev, dsink = jax.vjp(ref, q, wk, wv, ek, ev, sink)[1](do)
  return dq, dwk, dwv, None, dek, dev, None, dsink, None


_decode.defvjp(_decode_fwd, _decode_bwd)


def decode_attention_pallas(q_BxHxD, window_k_BxWxKxD, window_v_BxWxKxD, window_valid_BxW,
                            entry_k_BxCxKxD, entry_v_BxCxKxD, num_entries_B, *, sink_H,
                            entry_visible_BxCxK, scale, backend, interpret, num_splits,
                            block_sizes: DecodeBlockSizes):
  """Pallas implementation of ``kernels.decode_attention`` (same semantics)."""
  if backend == "pallas_tpu":
    interpret = interpret if isinstance(interpret, pltpu.InterpretParams) else bool(interpret)
  else:
    interpret = bool(interpret)
  return _decode(q_BxHxD, window_k_BxWxKxD, window_v_BxWxKxD, window_valid_BxW, entry_k_BxCxKxD,
                 entry_v_BxCxKxD, num_entries_B, sink_H, entry_visible_BxCxK, scale, backend,
                 interpret, num_splits, block_sizes)
