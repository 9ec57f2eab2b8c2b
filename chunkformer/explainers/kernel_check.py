"""The segment-packed kernels against their references, and their speed (notebooks/kernels_tour).

- ``attention_case``: random inputs of ``kernels.chunk_attention`` on a given chunking, the
  entries pooled by ``kernels.segment_pool`` (the reference) as the model does;
- ``check_chunk_attention`` / ``check_segment_pool``: the largest |kernel - reference| of the
  output and of every gradient, per implementation (Pallas in interpret mode unless the
  backend runs it natively);
- ``time_chunk_attention``: median forward and forward+backward wall seconds.
The kernels' own tests (tests/test_kernels_*.py) are the thorough version of the same checks.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import kernels

# Implementations that run natively on each backend; the others run in interpret mode.
NATIVE = {"gpu": "pallas_gpu", "tpu": "pallas_tpu"}


@contextlib.contextmanager
def fast_compiles() -> Iterator[None]:
  """Interpret-mode kernels are large XLA programs: optimising them costs more than running
  them, so XLA skips most optimisations inside this block (the setting is restored after)."""
  previous = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", True)
  try:
    yield
  finally:
    jax.config.update("jax_disable_most_optimizations", previous)


def attention_case(ends_BxT, segment_ids_BxT, *, capacity: int, heads: int, kv_heads: int,
                   head_dim: int, sink: bool = True, seed: int = 0,
                   dtype=jnp.float32) -> dict[str, Any]:
  """Inputs of ``chunk_attention`` (keyword names as its arguments) for a chunking.

  Entries are ``segment_pool`` (xla) of random values and gate logits over the chunks of
  ``ends``; q, k, v and the sink logits are standard normal.
  """
  rng = np.random.default_rng(seed)
  b, t = np.shape(ends_BxT)
  f = lambda *shape: jnp.asarray(rng.standard_normal(shape), dtype)
  ends = jnp.asarray(ends_BxT, bool)
  seg = jnp.asarray(segment_ids_BxT, jnp.int32)
  n = kv_heads * head_dim
  entries, entry_ends, entry_seg = kernels.segment_pool(f(b, t, n), f(b, t, n), ends, seg,
                                                        capacity=capacity)
  entries = entries.reshape(b, capacity, kv_heads, head_dim)
  return dict(q=f(b, t, heads, head_dim), k=f(b, t, kv_heads, head_dim),
              v=f(b, t, kv_heads, head_dim), segment_ids=seg, entry_k=entries,
              entry_v=entries[:, :, :, ::-1], entry_ends=entry_ends, entry_segment_ids=entry_seg,
              sink=f(heads).astype(jnp.float32) if sink else None,
              pool=dict(values=f(b, t, n), logits=f(b, t, n), ends=ends, segment_ids=seg,
                        slot_bias=f(8, n)))


def _attention_fn(implementation: str, window: int, interpret: bool, block_sizes):
  """jit(case arrays, cotangent) -> (o, gradients w.r.t. q, k, v, entry_k, entry_v)."""
  def run(q, k, v, seg, ek, ev, ends, eseg, sink, ct):
    def loss(q, k, v, ek, ev):
      o = kernels.chunk_attention(q, k, v, seg, ek, ev, ends, eseg, window=window, sink_H=sink,
                                  implementation=implementation, interpret=interpret,
                                  block_sizes=block_sizes)
      return jnp.sum(o.astype(jnp.float32) * ct), o
    (_, o), grads = jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True)(
        q, k, v, ek, ev)
    return o, grads
  return jax.jit(run)


def _arrays(case: dict[str, Any]) -> tuple:
  return (case["q"], case["k"], case["v"], case["segment_ids"], case["entry_k"],
          case["entry_v"], case["entry_ends"], case["entry_segment_ids"], case["sink"])


def _max_diff(a, b) -> float:
  return float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)), initial=0.0))


def _interpret(implementation: str) -> bool:
  return NATIVE.get(jax.default_backend()) != implementation


def check_chunk_attention(case: dict[str, Any], *, window: int,
                          implementations: Sequence[str] = ("pallas_gpu", "pallas_tpu"),
                          block_sizes: dict[str, Any] | None = None) -> list[dict[str, Any]]:
  """Per implementation: max |kernel - reference| of o and of dq, dk, dv, d_entry_k, d_entry_v.

  Returns records ``{"op", "implementation", "interpret", "output", "dq", ...}`` (floats).
  """
  block_sizes = block_sizes or {}
  arrays = _arrays(case)
  ct = jnp.asarray(np.random.default_rng(1).standard_normal(case["q"].shape), jnp.float32)
  want_o, want_g = _attention_fn("xla", window, False, None)(*arrays, ct)
  records = []
  for implementation in implementations:
    interpret = _interpret(implementation)
    got_o, got_g = _attention_fn(implementation, window, interpret,
                                 block_sizes.get(implementation))(*arrays, ct)
    record = {"op": "chunk_attention", "implementation": implementation,
              "interpret": interpret, "output": _max_diff(got_o, want_o)}
    for name, a, b in zip(("dq", "dk", "dv", "d_entry_k", "d_entry_v"), got_g, want_g,
                          strict=True):
      record[name] = _max_diff(a, b)
    records.append(record)
  return records


def check_segment_pool(case: dict[str, Any], *, capacity: int,
                       implementations: Sequence[str] = ("pallas_gpu", "pallas_tpu"),
                       block_sizes: dict[str, Any] | None = None) -> list[dict[str, Any]]:
  """Per implementation: max |kernel - reference| of the pooled entries and of the gradients
  w.r.t. values, gate logits and slot bias (records as ``check_chunk_attention``)."""
  block_sizes = block_sizes or {}
  pool = case["pool"]

  def fn(implementation, interpret, blocks):
    def run(values, logits, slot_bias, ct):
      def loss(values, logits, slot_bias):
        out, _, _ = kernels.segment_pool(values, logits, pool["ends"], pool["segment_ids"],
                                         capacity=capacity, slot_bias_SxN=slot_bias,
                                         implementation=implementation, interpret=interpret,
                                         block_sizes=blocks)
        return jnp.sum(out.astype(jnp.float32) * ct), out
      (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(
          values, logits, slot_bias)
      return out, grads
    return jax.jit(run)

  b, _, n = pool["values"].shape
  ct = jnp.asarray(np.random.default_rng(2).standard_normal((b, capacity, n)), jnp.float32)
  arrays = (pool["values"], pool["logits"], pool["slot_bias"], ct)
  want_o, want_g = fn("xla", False, None)(*arrays)
  records = []
  for implementation in implementations:
    interpret = _interpret(implementation)
    got_o, got_g = fn(implementation, interpret, block_sizes.get(implementation))(*arrays)
    record = {"op": "segment_pool", "implementation": implementation, "interpret": interpret,
              "output": _max_diff(got_o, want_o)}
    for name, a, b in zip(("d_values", "d_logits", "d_slot_bias"), got_g, want_g, strict=True):
      record[name] = _max_diff(a, b)
    records.append(record)
  return records


def median_time(fn: Callable[..., Any], *args: Any, repeats: int = 5) -> float:
  """Median wall seconds of ``fn(*args)`` (results waited for), after one warm-up call."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def time_chunk_attention(case: dict[str, Any], *, window: int, implementations: Sequence[str],
                         repeats: int = 5) -> list[dict[str, Any]]:
  """Median forward and forward+backward seconds of ``chunk_attention`` per implementation
  (each natively, no interpret mode: meant for a GPU or TPU backend)."""
  arrays = _arrays(case)
  ct = jnp.ones(case["q"].shape, jnp.float32)
  records = []
  for implementation in implementations:
    forward = jax.jit(lambda *a, implementation=implementation: kernels.chunk_attention(
        *a[:8], window=window, sink_H=a[8], implementation=implementation))
    both = _attention_fn(implementation, window, False, None)
    records.append({"implementation": implementation,
                    "forward_s": median_time(forward, *arrays, repeats=repeats),
                    "forward_backward_s": median_time(both, *arrays, ct, repeats=repeats)})
  return records
