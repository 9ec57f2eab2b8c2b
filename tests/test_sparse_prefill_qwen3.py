"""Sparse prefill on an imported Qwen3 checkpoint: the per-head search assigns patterns on
calibration prompts, and prefilling (then decoding) with them equals the transformers model
with each layer's heads masked to the same index sets."""

import os

import numpy as np
import torch
from safetensors.numpy import load_file
from transformers.models.qwen3 import modeling_qwen3

from chunkformer import decode
from chunkformer.convert import hf_files, qwen3
from chunkformer.model import Transformer
from chunkformer.sparse_prefill import AShape, BlockSparse, VerticalSlash
from chunkformer.sparse_prefill.search import prefill_indices, search
from tests.hf_qwen3 import save_tiny_qwen3

BLOCK, CALIBRATION, PROMPT, TOTAL, B = 8, 48, 40, 46, 2
CANDIDATES = (AShape(sink=8, local=8),
              VerticalSlash(vertical=3, slash=2, last_q=8, forced_vertical=1, forced_slash=1),
              BlockSparse(top=2))


def _numpy_mask(index, t):
  """visible_BxHxTxT from the definition: key s <= t in a listed block of t's query block, or
  a column that query block keeps."""
  blocks, counts, cols, keep = (np.asarray(x) for x in index)
  b, h = counts.shape[:2]
  out = np.zeros((b, h, t, t), bool)
  for r in range(b):
    for head in range(h):
      for q in range(t):
        n = q // BLOCK
        listed = blocks[r, head, n, :counts[r, head, n]]
        for s in range(q + 1):
          out[r, head, q, s] = s // BLOCK in listed or (
              s in cols[r, head][keep[r, head, n]])
  return out


def _hf_masked(hf_model, tokens, masks, monkeypatch):
  """Logits of the transformers model whose layer l attends under masks[l] (B x H x T x T)."""
  original = modeling_qwen3.eager_attention_forward

  def masked(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    mask = torch.as_tensor(masks[module.layer_idx])
    additive = torch.where(mask, 0.0, torch.finfo(torch.float32).min)
    return original(module, query, key, value, additive, scaling, dropout, **kwargs)

  monkeypatch.setattr(modeling_qwen3, "eager_attention_forward", masked)
  with torch.no_grad():
    return hf_model(torch.as_tensor(tokens)).logits.numpy()


def test_searched_patterns_match_transformers_masked_the_same_way(tmp_path, monkeypatch):
  hf_dir = str(tmp_path / "hf")
  hf_model = save_tiny_qwen3(hf_dir, tied=True, kv_heads=2)
  hf_model.set_attn_implementation("eager")
  config = qwen3.model_config(hf_files.read_config(hf_dir))
  params = qwen3.params_from_hf(config, load_file(os.path.join(hf_dir, "model.safetensors")))
  model = Transformer(config)
  rng = np.random.default_rng(0)
  calibration = rng.integers(0, 300, (B, CALIBRATION))

  found = search(model, params, calibration, CANDIDATES, block=BLOCK)
  assert len(found.plan.layers) == config.num_layers
  assert all(len(heads) == config.num_heads and set(heads) <= set(CANDIDATES)
             for heads in found.plan.layers)
  # Heads of one layer read different patterns: the prefill below runs merged indices.
  assert any(len(set(heads)) > 1 for heads in found.plan.layers)
  # The search's recall is the mass of transformers' own dense attention inside each
  # candidate's index, and every head took its best candidate.
  with torch.no_grad():
    dense = [a.numpy() for a in hf_model(torch.as_tensor(calibration),
                                         output_attentions=True).attentions]
  for c, pattern in enumerate(CANDIDATES):
    uniform = type(found.plan)(tuple((pattern,) * config.num_heads
                                     for _ in range(config.num_layers)), block=BLOCK)
    # layer 0's queries and keys are the same in the dense calibration pass and here
    index = prefill_indices(model, params, calibration, uniform)[0]
    mass = (dense[0] * _numpy_mask(index, CALIBRATION)).sum(-1).mean(axis=(0, 2))
    np.testing.assert_allclose(found.recall_LxHxC[0, :, c], mass, atol=1e-4)
  for layer, heads in enumerate(found.plan.layers):
    chosen = [CANDIDATES.index(p) for p in heads]
    np.testing.assert_array_equal(found.recall_LxHxC[layer, np.arange(len(heads)), chosen],
                                  found.recall_LxHxC[layer].max(-1))
  cheap = search(model, params, calibration, CANDIDATES, block=BLOCK, max_work=0.7)
  for layer, heads in enumerate(cheap.plan.layers):
    chosen = [CANDIDATES.index(p) for p in heads]
    assert (cheap.work_LxHxC[layer, np.arange(len(heads)), chosen] <= 0.7).all()

  tokens = rng.integers(0, 300, (B, TOTAL))
  logits, cache = decode.prefill(model, params, tokens[:, :PROMPT], TOTAL, sparse=found.plan)
  got = [np.asarray(logits)]
  for t in range(PROMPT, TOTAL):
    step_logits, cache = decode.step(model, params, cache, tokens[:, t:t + 1])
    got.append(np.asarray(step_logits)[:, None])
  got = np.concatenate(got, axis=1)

  masks = []
  for index in prefill_indices(model, params, tokens[:, :PROMPT], found.plan):
    mask = np.tril(np.ones((TOTAL, TOTAL), bool))[None, None].repeat(B, 0).repeat(
        config.num_heads, 1)
    mask[:, :, :PROMPT, :PROMPT] = _numpy_mask(index, PROMPT)  # decoded tokens see everything
    masks.append(mask)
  with torch.no_grad():
    unmasked = hf_model(torch.as_tensor(tokens)).logits.numpy()
  expected = _hf_masked(hf_model, tokens, masks, monkeypatch)
  np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
  assert np.abs(unmasked[:, :PROMPT] - expected[:, :PROMPT]).max() > 1e-2  # sparsity mattered
