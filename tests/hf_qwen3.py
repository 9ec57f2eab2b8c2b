"""Tiny random Hugging Face Qwen3 checkpoints for the conversion tests (torch: test-only)."""

from __future__ import annotations

import torch
import transformers


def save_tiny_qwen3(directory: str, *, tied: bool = True, kv_heads: int = 2, vocab: int = 300,
                    layers: int = 2, seed: int = 0, **overrides) -> transformers.Qwen3ForCausalLM:
  """Saves (safetensors) and returns a randomly initialised Qwen3 with hidden size 64.

  Every weight, norm scales included, is drawn at random so that a swapped mapping shows.
  """
  torch.manual_seed(seed)
  config = transformers.Qwen3Config(
      vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
      num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=16,
      tie_word_embeddings=tied, rms_norm_eps=1e-5,
      rope_parameters={"rope_type": "default", "rope_theta": 5000.0}, **overrides)
  model = transformers.Qwen3ForCausalLM(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.3 * torch.randn_like(p))
      else:
        p.copy_(0.15 * torch.randn_like(p))
  model.save_pretrained(directory)
  return model


def hf_logits(model: transformers.Qwen3ForCausalLM, tokens):
  """float32 numpy logits [B, T, V] of int tokens [B, T]."""
  with torch.no_grad():
    return model(torch.as_tensor(tokens, dtype=torch.long)).logits.numpy()
