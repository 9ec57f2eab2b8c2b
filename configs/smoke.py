"""Smoke test: a tiny model trains for a few steps in seconds (used by the tests).

  python train.py --config configs/smoke.py --workdir /tmp/chunkformer_smoke
"""

from configs import base


def get_config():
  c = base.get_config()
  c.seed = 0
  c.model.vocab_size = 32  # covers the kv task's 23 token ids; even, so it splits over tensor=2
  c.model.num_layers = 2
  c.model.d_model = 32
  c.model.num_heads = 2
  c.model.num_kv_heads = 2
  c.model.head_dim = 16
  c.model.mlp_dim = 64
  c.data.task = "kv"
  c.data.seq_len = 32
  c.data.batch_size = 8
  c.data.num_pairs = 4
  c.data.num_queries = 2
  c.data.num_symbols = 16
  c.data.near_distance = 12
  c.train.steps = 6
  c.train.learning_rate = 3e-3
  c.train.warmup_steps = 2
  c.train.log_every = 2
  c.train.eval_every = 3
  c.train.eval_batches = 2
  c.train.checkpoint_every = 2
  c.train.keep_checkpoints = 2
  return c
