"""Demo sweep: two full-attention controls, fixed chunks of M = 4 and three cures, one setup.

  python eval.py --config configs/sweeps/demo.py --workdir runs/demo
  (or ./run.sh demo; a second seed: --config.sweep.seed=1 --workdir runs/demo_seed1)

Trains the six variants (resumable; a finished one is not retrained), runs the needle shift
sweep (K = 16 offsets at far/middle/near depth, 48 haystacks), the '=' prefix probe and the
slot-gain analysis, and writes runs/demo/results.json, report.md and plots/. Sized to finish
in under 15 minutes on 2 CPU cores from nothing, training included (five variants took 568 s
on 2026-12-01, results/demo/RUN.md, about 100 s of training and 5-8 s of evaluation each; the
sixth, full_matched, costs about what full does: about 11 minutes in all).

Two full controls: ``full`` is configs/kv_full.py (width-2 key shift, no window), the
calibrated control that learns the task in the budget; ``full_matched`` is the fixed model's
own config with full attention (its resolved config differs from fixed_m4's in
``model.attention.kind`` alone), the like-for-like comparison for the blind spot.
"""

from configs.sweeps import sweep_config, variant

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


def get_config():
  return sweep_config(
      {
          # The calibrated control: full attention with its configured width-2 key shift (and
          # no sliding window); it differs from fixed_m4 in more than attention, see below.
          "full": variant("configs/kv_full.py"),
          # The matched control: the fixed model's config with full attention; the resolved
          # configs differ in model.attention.kind alone (no key shift, window ignored by full).
          "full_matched": variant("configs/kv_chunk.py", {"model.attention.kind": "full",
                                                          "model.key_shift": 0}),
          # The blind spot: fixed chunks of 4, no key shift (the shift is a cure).
          "fixed_m4": variant("configs/kv_chunk.py", {"model.attention.chunk_size": 4,
                                                      "model.key_shift": 0}),
          # The default cure: content-defined chunks, budget-matched to 4 tokens per entry.
          "dynamic_m4": variant("configs/kv_dynamic.py", {"model.attention.chunk_size": 4,
                                                          "model.key_shift": 0}),
          # The other cures at the same budget: chunks closed after delimiter tokens, and
          # fixed chunks whose offsets are staggered over the kv heads.
          "delimiter_m4": variant("configs/kv_delimiter.py", {"model.key_shift": 0}),
          "stagger_m4": variant("configs/kv_chunk.py", {"model.attention.chunk_size": 4,
                                                        "model.attention.stagger": "heads",
                                                        "model.key_shift": 0}),
      },
      overrides=SHARED,
      name="demo",
      reference_chunk_size=4,
      eval_batch_size=64,
      probes=dict(needle_sweep=dict(num_offsets=16, num_haystacks=48, depths=(0.0, 0.5, 1.0)),
                  prefix_probe=dict(prompts=32, max_prefix=12),
                  slot_gain=dict(rows=64)),
  )
