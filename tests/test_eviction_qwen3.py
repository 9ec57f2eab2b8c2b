"""Eviction on an imported Qwen3 checkpoint: decoding from the pruned cache equals the
transformers model run with the evicted keys masked out of every later query's view."""

import os

import numpy as np
import torch
from safetensors.numpy import load_file

from chunkformer import decode
from chunkformer.convert import hf_files, qwen3
from chunkformer.eviction import ChunkKV
from chunkformer.model import Transformer
from tests.hf_qwen3 import save_tiny_qwen3

PROMPT, TOTAL, B = 24, 30, 2


def test_decoding_a_pruned_qwen3_cache_matches_transformers_with_a_mask(tmp_path):
  hf_dir = str(tmp_path / "hf")
  hf_model = save_tiny_qwen3(hf_dir, tied=True, kv_heads=2)
  config = qwen3.model_config(hf_files.read_config(hf_dir))
  params = qwen3.params_from_hf(config, load_file(os.path.join(hf_dir, "model.safetensors")))
  model = Transformer(config)
  tokens = np.random.default_rng(0).integers(0, 300, (B, TOTAL))
  # ChunkKV with one selection for both layers and all heads: a mask transformers can take
  policy = ChunkKV(budget=0.5, window=3, chunk=4, kernel=3, layer_reuse=2)
  logits, cache, kept = decode.prefill_kept(model, params, tokens[:, :PROMPT], TOTAL, policy)
  got = [np.asarray(logits)]
  for t in range(PROMPT, TOTAL):
    step_logits, cache = decode.step(model, params, cache, tokens[:, t:t + 1])
    got.append(np.asarray(step_logits)[:, None])
  got = np.concatenate(got, axis=1)
  kept = np.asarray(kept[0])[:, 0]  # B x N, the same for every layer and head
  assert kept.shape == (B, 12) and (kept[:, -3:] == [21, 22, 23]).all()

  visible = np.tril(np.ones((TOTAL, TOTAL), bool))[None].repeat(B, 0)
  for b in range(B):
    evicted = np.setdiff1d(np.arange(PROMPT), kept[b])
    visible[b][np.ix_(np.arange(PROMPT, TOTAL), evicted)] = False
  additive = np.where(visible, 0.0, np.finfo(np.float32).min)[:, None].astype(np.float32)
  with torch.no_grad():
    expected = hf_model(torch.as_tensor(tokens), attention_mask=torch.as_tensor(additive)
                        ).logits.numpy()
  np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
  with torch.no_grad():
    unmasked = hf_model(torch.as_tensor(tokens)).logits.numpy()
  assert np.abs(unmasked[:, PROMPT:] - expected[:, PROMPT:]).max() > 1e-2  # eviction mattered
  assert decode.cache_bytes(cache) < decode.cache_bytes(decode.init_cache(config, B, TOTAL))
