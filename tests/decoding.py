"""Shared by the decode == forward tests: a model's logits decoded token by token beside its
forward pass."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from chunkformer import decode


def decoded_and_forward(model, params, tokens_BxT, prompt_len: int, max_len: int):
  """(logits from prefill of the first ``prompt_len`` tokens then one decode step per token,
  logits of one forward pass over all tokens, the final cache)."""
  expected = jax.jit(model.apply)({"params": params}, tokens_BxT)
  logits, cache = decode.prefill(model, params, tokens_BxT[:, :prompt_len], max_len)
  got = [logits]
  for t in range(prompt_len, tokens_BxT.shape[1]):
    step_logits, cache = decode.step(model, params, cache, tokens_BxT[:, t:t + 1])
    got.append(step_logits[:, None])
  return jnp.concatenate(got, axis=1), expected, cache
