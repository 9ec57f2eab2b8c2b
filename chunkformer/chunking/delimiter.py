"""Rule-based boundaries: a chunk closes at every configured delimiter token.

The rule looks at the token at t only, so it is causal and exactly shift invariant: moving a
text by k tokens moves every proposal by k. ``max_chunk`` (and ``min_chunk``) are applied by
``end_flags.enforce_lengths``; with ``min_chunk == 1`` every delimiter closes a chunk, so the
boundaries re-synchronise at the first delimiter after any disturbance.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def delimiter_proposals(tokens_BxT: Array, delimiter_ids: tuple[int, ...]) -> Array:
  """bool_BxT: token t is one of ``delimiter_ids`` (a chunk should close right after it)."""
  if not delimiter_ids:
    raise ValueError("the delimiter rule needs at least one delimiter token id")
  return jnp.isin(tokens_BxT, jnp.asarray(delimiter_ids, dtype=tokens_BxT.dtype))
