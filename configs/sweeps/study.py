"""The study: reproduce the DeepSeek-V4 periodicity findings and put the cures beside them.

  python eval.py --config configs/sweeps/study.py --workdir results/study

Variants (one small model and task for all, so that only the named switch differs):
- controls: full attention without (1500 steps) and with the width-2 key token shift;
- fixed chunks, M in {2, 4, 6, 8, 12} (the claim: accuracy period exactly M);
- ablations at M = 4: RoPE off; uniform (mean) pooling (the claim: still periodic);
- cures at a budget of 4 tokens per entry: overlap (DeepSeek CSA), chunk offsets staggered over
  the kv heads, learned dynamic boundaries (router, ratio-loss target 4), rule-based dynamic
  boundaries (after delimiter tokens, configs/kv_delimiter.py), and M = 4 and dynamic with the
  key token shift;
- needle length: full, M = 4 and dynamic again with 2-token keys and 2-token values (2000
  steps).
K = 48 offsets (2 x lcm(2, 4, 6, 8, 12), >= 3 x 12), window starts aligned to 24 tokens.
Target: under 60 minutes on 2 CPU cores; variants train one after another and resume.
"""

from configs.sweeps import sweep_config, variant

SHARED = {
    "model.num_layers": 2,
    "model.d_model": 64,
    "model.num_heads": 4,
    "model.num_kv_heads": 4,
    "model.head_dim": 16,
    "model.mlp_dim": 256,
    "model.rope_fraction": 0.25,  # partial rotary as DeepSeek (64 of 512); helps the full control
    "data.seq_len": 160,
    "data.num_pairs": 6,
    "data.num_queries": 4,
    "data.num_symbols": 16,
    "data.near_distance": 40,
    "train.steps": 600,
    "train.learning_rate": 3e-3,
    "train.warmup_steps": 50,
    "train.log_every": 100,
    "train.eval_every": 100000,  # no held-out pass during training; the sweep evaluates
    "train.checkpoint_every": 200,
}
NO_SHIFT = {"model.key_shift": 0}
SHIFT = {"model.key_shift": 2}
# Two-token keys need a previous-token circuit before retrieval works: at 600 steps every
# model (full included) stayed below 50% far accuracy (results/study/RUN.md), so they train longer.
LONG_NEEDLES = {"data.key_len": 2, "data.value_len": 2, "train.steps": 2000}


def _fixed(m: int, **extra):
  return variant("configs/kv_chunk.py", {"model.attention.chunk_size": m, **NO_SHIFT, **extra})


def _dynamic(**extra):
  return variant("configs/kv_dynamic.py", {"model.attention.chunk_size": 4,
                                           "model.attention.boundary": "router", **NO_SHIFT,
                                           **extra})


def get_config():
  variants = {
      # Without the key shift, full attention needs longer to form its retrieval circuit: 0.854
      # far accuracy at 600 steps, 0.979 at 1500 (the claim is about a model that learned it).
      "full": variant("configs/kv_full.py", {**NO_SHIFT, "train.steps": 1500}),
      "full_shift": variant("configs/kv_full.py", SHIFT),
      **{f"fixed_m{m}": _fixed(m) for m in (2, 4, 6, 8, 12)},
      "fixed_m4_norope": _fixed(4, **{"model.rope": False}),
      "fixed_m4_mean": _fixed(4, **{"model.attention.pooling": "mean"}),
      "fixed_m4_overlap": _fixed(4, **{"model.attention.overlap": True}),
      "stagger_m4": _fixed(4, **{"model.attention.stagger": "heads"}),
      "dynamic_m4": _dynamic(),
      "delimiter_m4": variant("configs/kv_delimiter.py", NO_SHIFT),
      "fixed_m4_shift": _fixed(4, **SHIFT),
      "dynamic_m4_shift": _dynamic(**SHIFT),
      "full_kv2": variant("configs/kv_full.py", {**NO_SHIFT, **LONG_NEEDLES}),
      "fixed_m4_kv2": _fixed(4, **LONG_NEEDLES),
      "dynamic_m4_kv2": _dynamic(**LONG_NEEDLES),
  }
  return sweep_config(
      variants,
      overrides=SHARED,
      name="study",
      num_offsets=48,
      num_haystacks=32,
      depths=(0.0, 0.5, 1.0),
      reference_chunk_size=4,
      prefix_max=24,
      prefix_prompts=32,
      slot_gain_rows=64,
      eval_batch_size=64,
  )
