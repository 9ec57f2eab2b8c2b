"""Byte-level language model with full attention on the interpreter's standard library.

  python train.py --config configs/code_full.py --workdir workdirs/code_full
"""

from configs import base, common


def get_config():
  c = base.get_config()
  c.model.vocab_size = 260  # 256 bytes + specials of the code task
  c.model.num_layers = 4
  c.model.d_model = 128
  c.model.num_heads = 4
  c.model.num_kv_heads = 4
  c.model.head_dim = 32
  c.model.mlp_dim = 512
  c.model.attention.kind = "full"
  common.code_task(c, batch_size=32)
  common.schedule(c, steps=2000, learning_rate=1e-3, warmup_steps=100, eval_every=500,
                  checkpoint_every=500)
  return c
