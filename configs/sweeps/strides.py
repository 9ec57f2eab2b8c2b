"""The paper's strides on the needle study's task: fixed chunks of S = 4, 6, 8 and 12 tokens, and
an overlapping W8/S4 compressor, each with two seeds on the current code, beside two seeds of
the full-attention control.

  python eval.py --config configs/sweeps/strides.py --workdir results/strides [--shard i/2]

Everything but the compressor's geometry is the study's (``study.SHARED``: 2 layers, width 64,
4 KV heads, 1-token keys and values among 6 records, 160-token rows, learning rate 3e-3) and so
is the budget rule: STEPS = 1500 for every unit, the step at which the study's full-attention
control first reached 0.95 far accuracy (``configs/sweeps/study.py``). The analysis plan,
committed before any unit trained, is ``results/strides/PLAN.md``: C1 (period exactly S) for
each plain fixed S, C2 (no period) for full attention, both by the study's rules
(``docs/claims.md``); the overlapping row is reported without a claim.
"""

from configs.sweeps import seeded_units, study, sweep_config, variant

# variant -> (its definition, number of seeds); seed-major order keeps a stopped sweep useful.
VARIANTS = {
    "full": (variant("configs/kv_full.py", study.NO_SHIFT), 2),
    "fixed_s4": (study.fixed(4), 2),
    "fixed_s6": (study.fixed(6), 2),
    "fixed_s8": (study.fixed(8), 2),
    "fixed_s12": (study.fixed(12), 2),
    "fixed_w8s4": (study.fixed(4, **{"model.attention.compress_window": 8}), 2),
}


def get_config():
  return sweep_config(
      seeded_units(VARIANTS), overrides=study.SHARED, name="strides", reference_chunk_size=4,
      eval_batch_size=64, plan="results/strides/PLAN.md",
      probes=dict(needle_sweep=dict(num_offsets=48, num_haystacks=32, depths=(0.0, 0.5, 1.0)),
                  slot_gain=dict(rows=64)))
