"""Control of the study: full causal attention on synthetic key-value retrieval.

  python train.py --config configs/kv_full.py --workdir workdirs/kv_full

16 one-token key-value pairs at random offsets in 256 tokens, 4 queries per row; held-out
``far_accuracy`` (needle more than 64 tokens before its query) is the number to watch.
A width-2 key shift (k_t += W' x_{t-1}) is on: without it a small full-attention model must
first form an induction circuit and can sit at chance for thousands of steps (issue 2).
"""

from configs import base


def get_config():
  c = base.get_config()
  c.model.num_layers = 2
  c.model.d_model = 128
  c.model.num_heads = 4
  c.model.num_kv_heads = 4
  c.model.head_dim = 32
  c.model.mlp_dim = 512
  c.model.vocab_size = 128  # the kv task uses 71 ids; a round size for sharding
  c.model.key_shift = 2
  c.model.attention.kind = "full"
  c.data.task = "kv"
  c.data.seq_len = 256
  c.data.batch_size = 32
  c.data.num_pairs = 16
  c.data.num_queries = 4
  c.data.near_distance = 64
  c.train.steps = 1000
  c.train.learning_rate = 1e-3
  c.train.warmup_steps = 100
  c.train.log_every = 50
  c.train.eval_every = 250
  c.train.eval_batches = 8
  c.train.checkpoint_every = 250
  return c
