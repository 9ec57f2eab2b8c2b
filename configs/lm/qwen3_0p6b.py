"""Qwen3-0.6B, the study's model, trained from scratch with each attention variant.

  python train.py --config configs/lm/qwen3_0p6b.py:full --workdir workdirs/qwen3_0p6b_full

Shape of Qwen3-0.6B: 28 layers, d_model 1024, 16 query heads and 8 key/value heads of head
dim 128 (GQA), SwiGLU width 3072, QK-norm, RoPE base 1e6 (full rotary), tied embeddings,
vocabulary 151936. Parameters float32, compute bfloat16; every block rematerialised (policy
``full``) and the layers scanned; fully sharded data parallel over every device
(mesh.fsdp = -1: parameters and optimiser state split over ``fsdp`` along the model width,
the batch over ``data`` x ``fsdp``; heads, MLP and vocabulary over ``tensor`` when
``--config.mesh.tensor`` > 1). ``bench/scale_plan.py`` compiles this config's training step
and records which accelerators it fits (bench/results/scale_plan.md).

The data here is the byte-level ``code`` task, a stand-in that runs offline (its 260 ids sit
inside the vocabulary); point ``data`` at a real corpus for the study itself.

Attention variants (the argument after the colon):
  full      full causal attention (the control)
  fixed     fixed chunks of M = 4 tokens (gated pooling with slot bias, shared-KV entries)
            plus a sliding window of 128 raw tokens
  dynamic   learned (H-Net router) chunks at a target of 4 tokens per entry (2..8 tokens),
            same window and pooling
  v4        DeepSeek-V4 alternation: CSA (M = 4 with overlap) and HCA (M = 128) layers,
            window 128 (model.layer_pattern "chunk_size=4,overlap=true;chunk_size=128")
e.g. ``--config configs/lm/qwen3_0p6b.py:fixed`` or ``get_config("fixed")``; any field can
still be overridden, e.g. ``--config.data.seq_len=32768 --config.train.grad_accum_steps=4``.
"""

from configs import base

VARIANTS = ("full", "fixed", "dynamic", "v4")


def apply_variant(c, variant: str, window: int = 128) -> None:
  """Sets the attention fields of ``variant`` (one of VARIANTS) on ConfigDict ``c``."""
  if variant not in VARIANTS:
    raise ValueError(f"config argument {variant!r}: expected one of {', '.join(VARIANTS)}")
  a = c.model.attention
  if variant == "full":
    a.kind = "full"
    return
  a.window = window  # raw tokens every query sees besides the entries
  a.chunk_size = 4  # M (dynamic: target tokens per entry)
  a.pooling = "gated"
  if variant in ("fixed", "v4"):
    a.kind = "fixed"
  if variant == "v4":
    c.model.layer_pattern = "chunk_size=4,overlap=true;chunk_size=128"
  if variant == "dynamic":
    a.kind = "dynamic"
    a.boundary = "router"
    a.min_chunk = 2
    a.max_chunk = 8
    a.ratio_loss_weight = 10.0  # held the budget in the study (bench/results/measurements.md)


def get_config(variant: str = "full"):
  c = base.get_config()
  m = c.model
  m.vocab_size = 151936
  m.num_layers = 28
  m.d_model = 1024
  m.num_heads = 16
  m.num_kv_heads = 8
  m.head_dim = 128
  m.mlp_dim = 3072
  m.qk_norm = True
  m.rope_base = 1e6
  m.tie_embeddings = True
  m.dtype = "bfloat16"  # compute
  m.param_dtype = "float32"  # parameters and optimiser state
  m.remat = "full"
  m.scan_layers = True
  apply_variant(c, variant)
  c.data.task = "code"
  c.data.seq_len = 4096
  c.data.batch_size = 64  # global rows per update (262144 tokens)
  c.train.steps = 20000
  c.train.learning_rate = 3e-4
  c.train.warmup_steps = 1000
  c.train.weight_decay = 0.1
  c.train.log_every = 20
  c.train.eval_every = 1000
  c.train.checkpoint_every = 1000
  c.mesh.data = 1
  c.mesh.fsdp = -1  # FSDP over every device
  c.mesh.tensor = 1
  return c
