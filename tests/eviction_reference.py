"""The reference eviction is judged against: one forward pass in which every query after the
prompt sees only the prompt keys its layer and kv head kept (test-only)."""

from __future__ import annotations

from unittest import mock

import flax.linen as nn
import jax
import numpy as np

from chunkformer.attention.full import FullAttention


def keep_masks(kept_LxBxKxN, num_heads: int, prompt_len: int, total: int) -> np.ndarray:
  """bool L x B x H x T x T: query t sees key s unless t >= prompt_len > s and s was evicted
  from its layer's cache for the query head's kv head."""
  kept = np.asarray(kept_LxBxKxN)
  layers, b, k, _ = kept.shape
  kept_prompt = np.zeros((layers, b, k, prompt_len), bool)
  np.put_along_axis(kept_prompt, kept, True, axis=-1)
  kept_prompt = np.repeat(kept_prompt, num_heads // k, axis=2)  # query head h reads kv h // G
  mask = np.ones((layers, b, num_heads, total, total), bool)
  mask[:, :, :, prompt_len:, :prompt_len] = kept_prompt[:, :, :, None, :]
  return mask


def masked_forward(model, params, tokens_BxT, masks_LxBxHxTxT):
  """Logits of the model's own forward pass with each full layer's attention mask AND-ed with
  its ``keep_masks`` entry (the layer found by intercepting the attention modules)."""
  layer = {}
  plain = jax.nn.dot_product_attention

  def attention(q, k, v, mask=None, **kwargs):
    return plain(q, k, v, mask=mask & masks_LxBxHxTxT[layer["now"]], **kwargs)

  def note_layer(next_fun, args, kwargs, context):
    if isinstance(context.module, FullAttention) and context.method_name == "__call__":
      layer["now"] = context.module.layer
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(note_layer), mock.patch.object(jax.nn, "dot_product_attention",
                                                           attention):
    return model.apply({"params": params}, tokens_BxT)


masked_forward_jit = jax.jit(masked_forward, static_argnums=0)
