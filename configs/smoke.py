"""Smoke test: a tiny model trains for a few steps in seconds (used by the tests).

  python train.py --config configs/smoke.py --workdir /tmp/chunkformer_smoke
"""

from configs import base, common


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
  common.kv_task(c, seq_len=32, batch_size=8, num_pairs=4, num_queries=2, num_symbols=16,
                 near_distance=12)
  common.schedule(c, steps=6, learning_rate=3e-3, warmup_steps=2, log_every=2, eval_every=3,
                  eval_batches=2, checkpoint_every=2)
  c.train.keep_checkpoints = 2
  return c
