"""Demo sweep: the full-attention control, fixed chunks of M = 4 and the dynamic cure, 2 seeds.

  ./run.sh demo            (two shards in parallel, one per core, into runs/demo)
  python eval.py --config configs/sweeps/demo.py --workdir runs/demo [--shard i/2]

Trains the six units (three variants x seeds 0 and 1; resumable: a finished unit is not
retrained), runs the needle shift sweep (K = 16 offsets at far/middle/near depth, 48
haystacks) and writes runs/demo/results.json, report.md and plots/. It decides the three claims
a newcomer asks about under the current claim rules, which need two seeds agreeing and a
control that learned the task:
- C1: fixed chunks of step M give an accuracy period of exactly M (``fixed_m4``);
- C2: full attention shows no period (``full``, at >= 95% far accuracy);
- C8: content-defined chunks (the learned router) remove the blind spot (``dynamic_m4``).

What the demo gives up against the full needle study (``configs/sweeps/study.py``,
``results/study``): one small model and task, 600 steps per unit, two seeds instead of three;
no full-attention control matched to the fixed model except in attention (without the key
shift full attention does not learn the task in 600 steps: ``results/demo/RUN.md``), no
delimiter, stagger or key-shift cure, no ablation (C3-C5), no prefix probe or slot gains (C6,
C7).

The control, ``full``, is configs/kv_full.py: full attention with a width-2 key shift and no
window, calibrated to learn the task in the budget; the fixed and dynamic models have no key
shift (the shift is a cure of its own, C9).
"""

from configs.sweeps import seeded_units, sweep_config, variant

# One small model and task for every variant, so that only the attention differs.
SHARED = {
    "model.num_layers": 2,
    "model.d_model": 64,
    "model.num_heads": 4,
    "model.num_kv_heads": 4,
    "model.head_dim": 16,
    "model.mlp_dim": 256,
    "model.rope_fraction": 1.0,  # full rotary: the setting this demo was calibrated with
    "data.seq_len": 96,
    "data.num_pairs": 6,
    "data.num_queries": 4,
    "data.num_symbols": 16,
    "data.near_distance": 24,
    "train.steps": 600,
    "train.learning_rate": 3e-3,
    "train.warmup_steps": 50,
    "train.log_every": 50,
    "train.eval_every": 100000,  # no held-out pass during training; the sweep evaluates
    "train.checkpoint_every": 200,
}
SEEDS = 2  # the current claim rules decide on two seeds agreeing, never one

VARIANTS = {
    # The control: full attention with its configured width-2 key shift (no sliding window).
    "full": variant("configs/kv_full.py"),
    # The blind spot: fixed chunks of 4, no key shift.
    "fixed_m4": variant("configs/kv_chunk.py", {"model.attention.chunk_size": 4,
                                                "model.key_shift": 0}),
    # The cure: content-defined chunks, budget-matched to 4 tokens per entry.
    "dynamic_m4": variant("configs/kv_dynamic.py", {"model.attention.chunk_size": 4,
                                                    "model.key_shift": 0}),
}


def get_config():
  return sweep_config(
      seeded_units({name: (v, SEEDS) for name, v in VARIANTS.items()}),
      overrides=SHARED,
      name="demo",
      reference_chunk_size=4,
      eval_batch_size=64,
      probes=dict(needle_sweep=dict(num_offsets=16, num_haystacks=48, depths=(0.0, 0.5, 1.0))),
  )
