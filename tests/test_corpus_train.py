"""Task corpus in the model and the training loop.

- Packing: no query, chunk pool or loss reaches across a document, by gradient, for the full,
  fixed and dynamic kinds.
- Resume: a run preempted (SIGTERM) and rerun sees the batches of an uninterrupted run (same
  per-step losses, parameters and final metrics): the Grain iterator state is in the checkpoint.
- A checkpoint whose dataset was made with another tokenizer is refused, naming both hashes.
"""

from __future__ import annotations

import os
import shutil
import signal

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from chunkformer import config as config_lib
from chunkformer import objective, trainer
from chunkformer.config import AttentionConfig, ConfigError, ModelConfig
from chunkformer.data import ingest
from chunkformer.data import tokenizer as tokenizer_lib
from chunkformer.model import Transformer
from tests.test_corpus import TEXTS, write_corpus

T = 24
DOC_B = 11  # document B starts here; fixed chunks of 4 straddle it (8..11)
KINDS = {
    "full": AttentionConfig(kind="full"),
    "fixed": AttentionConfig(kind="fixed", chunk_size=4, window=3, overlap=True),
    "dynamic": AttentionConfig(kind="dynamic", chunk_size=4, min_chunk=2, max_chunk=6,
                               window=3),
}


def _packed_row(one_document: bool):
  """Two packed documents over disjoint token sets, as the corpus pipeline lays them out."""
  rng = np.random.default_rng(0)
  tokens = np.concatenate([rng.integers(1, 20, DOC_B), rng.integers(32, 60, T + 1 - DOC_B)])
  seg = np.where(np.arange(T + 1) < DOC_B, 1, 2)
  if one_document:
    seg = np.ones_like(seg)
  pos = np.concatenate([np.arange(DOC_B), np.arange(T + 1 - DOC_B)]) if not one_document \
      else np.arange(T + 1)
  batch = {"inputs": tokens[:-1], "targets": tokens[1:], "positions": pos[:-1],
           "segment_ids": seg[:-1], "loss_mask": (seg[1:] == seg[:-1]).astype(np.float32)}
  return {k: jnp.asarray(v)[None] for k, v in batch.items()}


@pytest.mark.parametrize("kind", list(KINDS))
def test_no_query_chunk_or_loss_reaches_across_a_document(kind):
  # Untied embeddings: document A's token rows are inputs only, so any gradient on them from
  # document B's loss must have travelled through attention, a chunk entry or a token shift.
  model_cfg = ModelConfig(vocab_size=64, num_layers=2, d_model=32, num_heads=2, num_kv_heads=2,
                          head_dim=16, mlp_dim=64, tie_embeddings=False, key_shift=2,
                          value_shift=True, attention=KINDS[kind])
  model_cfg.validate()
  model = Transformer(model_cfg)
  packed, control = _packed_row(one_document=False), _packed_row(one_document=True)
  params = nn.meta.unbox(model.init(jax.random.key(0), packed["inputs"], packed["positions"],
                                    packed["segment_ids"])["params"])

  @jax.jit
  def grad_of_document_b(batch):
    def loss(p):
      logits, _ = objective.forward(model, p, batch, train=False)
      ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
      return jnp.sum(ce * batch["loss_mask"] * (jnp.arange(T) >= DOC_B)[None])
    return jax.grad(loss)(params)["embedding"]

  tokens_a = np.unique(np.asarray(packed["inputs"][0, :DOC_B]))
  tokens_b = np.unique(np.asarray(packed["inputs"][0, DOC_B:]))
  grad_VxE = grad_of_document_b(packed)
  chex.assert_tree_all_finite(grad_VxE)
  assert jnp.abs(grad_VxE[tokens_b]).max() > 0
  assert jnp.abs(grad_VxE[tokens_a]).max() == 0.0
  # Control: the same tokens as one document do reach B's loss, so the check can fail.
  assert jnp.abs(grad_of_document_b(control)[tokens_a]).max() > 0


def _corpus_config(path, **train):
  c = {"seed": 0,
       "model": {"vocab_size": 260, "num_layers": 1, "d_model": 32, "num_heads": 2,
                 "num_kv_heads": 2, "head_dim": 16, "mlp_dim": 64},
       "data": {"task": "corpus", "path": path, "seq_len": 32, "batch_size": 4,
                "read_threads": 1},
       "train": {"steps": 5, "checkpoint_every": 1, "log_every": 1, "eval_every": 100,
                 "eval_batches": 2, "keep_checkpoints": 2, "warmup_steps": 1} | train}
  return config_lib.from_dict(c)


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
  base = tmp_path_factory.mktemp("corpus_train")
  out = str(base / "shards")
  ingest.ingest(write_corpus(str(base / "in")), "bytes", out, heldout_fraction=0.2)
  return out


def _run(config, workdir, stop_after=None):
  losses = {}

  def hook(p: trainer.Progress) -> None:
    if p.split == "train":
      losses[p.step] = p.metrics["loss"]
      if p.step == stop_after:
        os.kill(os.getpid(), signal.SIGTERM)

  return trainer.train(config, workdir, progress=hook), losses


def test_preempted_corpus_run_resumes_with_the_uninterrupted_batches(dataset_dir, tmp_path):
  config = _corpus_config(dataset_dir)
  reference, reference_losses = _run(config, str(tmp_path / "uninterrupted"))
  assert set(reference["heldout"]) >= {"loss", "bits_per_byte"}
  assert np.isfinite(reference["heldout"]["bits_per_byte"])
  stopped, first = _run(config, str(tmp_path / "resumed"), stop_after=2)
  assert stopped == {"step": 2, "preempted": True}
  resumed, rest = _run(config, str(tmp_path / "resumed"))
  assert sorted(rest) == [3, 4, 5]  # continued at step 2
  assert first | rest == reference_losses  # the same batches, so bitwise the same losses
  assert resumed == reference
  assert os.listdir(tmp_path / "resumed" / "checkpoints" / "5" / "data") \
      == os.listdir(tmp_path / "uninterrupted" / "checkpoints" / "5" / "data")


def test_resuming_on_shards_of_another_tokenizer_is_refused(dataset_dir, tmp_path):
  shards = str(tmp_path / "shards")
  shutil.copytree(dataset_dir, shards)
  config = _corpus_config(shards, steps=1)
  trainer.train(config, str(tmp_path / "run"))
  old_hash = ingest.read_manifest(shards)["tokenizer"]["hash"]
  tok = str(tmp_path / "tok.json")
  tokenizer_lib.train_bpe([os.path.join(dataset_dir, "..", "in", "doc_000.txt")], 258).save(tok)
  new_hash = tokenizer_lib.load(tok).hash
  ingest.ingest(write_corpus(str(tmp_path / "in"), texts=TEXTS), tok, shards, overwrite=True,
                heldout_fraction=0.2)
  with pytest.raises(ConfigError, match=f"hash {old_hash}.*hash {new_hash}"):
    trainer.train(config, str(tmp_path / "run"))
