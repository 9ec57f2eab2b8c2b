"""A tiny model of the Qwen3-0.6B family that trains on 2 CPU cores in minutes.

  python train.py --config configs/lm/qwen3_tiny.py --workdir workdirs/qwen3_tiny

Same architecture as configs/lm/qwen3_0p6b.py (GQA 2:1, QK-norm, RoPE base 1e6, SwiGLU, tied
embeddings, remat ``full``, scanned layers), scaled to 4 layers of width 128 on the byte-level
``code`` task. Compute stays float32 here: bfloat16 matmuls are emulated on CPU (slower);
``--config.model.dtype=bfloat16`` runs the study's mixed precision. The trainer logs model
FLOPs utilisation against this machine's measured float32 matmul rate. Attention variants as
in qwen3_0p6b (``configs/lm/qwen3_tiny.py:fixed``, ``:dynamic``, ``:v4``; window 32).
"""

from configs import base, common
from configs.lm import qwen3_0p6b


def get_config(variant: str = "full"):
  c = base.get_config()
  m = c.model
  m.vocab_size = 260  # the code task's 256 bytes + specials
  m.num_layers = 4
  m.d_model = 128
  m.num_heads = 4
  m.num_kv_heads = 2
  m.head_dim = 32
  m.mlp_dim = 384
  m.qk_norm = True
  m.rope_base = 1e6
  m.tie_embeddings = True
  m.remat = "full"
  m.scan_layers = True
  qwen3_0p6b.apply_variant(c, variant, window=32)
  common.code_task(c, batch_size=16)
  common.schedule(c, steps=300, learning_rate=2e-3, warmup_steps=50, log_every=25, eval_every=100,
                  eval_batches=4, checkpoint_every=100)
  return c
