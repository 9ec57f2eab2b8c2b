"""C7 and the periodic signature of ordinary language modelling: byte-level code LMs.

  python eval.py --config configs/sweeps/code_lm.py --workdir results/code_lm

Every unit is one byte-level language model on the corpus pipeline (``configs/lm/code_small.py``:
the standard library as ``builtin:stdlib`` shards, documents packed into rows) with 4 key-value
needle lines planted per row (``KEY_xxxx = "vvvv"``, asked again at the row end; the planting is
a transform of the pipeline, ``data.code_needles``). The units differ ONLY in attention:

- ``full``: full causal attention;
- ``fixed_m4``: fixed chunks of M = 4 (window W = 8 raw tokens + gated-pooled entries);
- ``dynamic_m4``: learned router (H-Net rule "start"), ratio loss holding 4 tokens per entry,
  chunks of 3 to 8 tokens, same window and pooling; its achieved ratio is measured;
- ``fixed_m4_shift``: fixed M = 4 with the width-2 key token shift;
- ``full_shift``: full attention with the same key shift (the control of that cure).

Seeds: 3 per variant (units ``<variant>_seed<k>``, config.seed = k + sweep.seed), 15 units.

Training budget, the same for every unit, fixed in advance: STEPS updates of BATCH rows of
SEQ_LEN bytes (1000 x 8 x 256 = 2.05 M tokens per unit), one learning-rate schedule; the size
that fits about two hours of 2 CPU cores. Measured (results/code_lm/HISTORY.md): at this budget the
full control does NOT learn the needles (held-out answer bytes at chance, 0.036-0.052; no
needle exact in the probe; also not with key shift 2 + partial rotary 0.25), so the needle part
of C7 needs a larger budget (``--config.overrides.train.steps=...``, the same for every unit)
or an accelerator; the loss by position mod 4 and bits per byte are measured at any budget.

Evaluation of each unit (``chunkformer/evaluation/sweep/unit.py``):
- the '=' prefix probe: 64 held-out prompts x N = 0..12 leading '=' bytes; needle accuracy (all 4
  answer bytes right) and byte accuracy on the code, by N, by N mod 4 and by each needle's own
  phase (``prefix_probe.needle_phases``: the answer's and the planted value's position mod 4);
- held-out next-byte loss by absolute position mod 4, per held-out batch (``lm_phase_loss``),
  and bits per byte.

CPU budget (``python bench/code_lm_steps.py --steps 15``: seed 0 of each variant at exactly
this config, 15 timed steps after compile, 2026-12-01 03:46-03:56 UTC, ``nice -n 10`` under
load, load average 15-16 on the 2 shared cores; bench/results/code_lm_steps_cpu.json). CPU
seconds per step (all threads; bounds the wall per step on 2 quiet cores) / wall under load:
full 0.41 / 1.66, fixed_m4 0.40 / 1.56, dynamic_m4 0.47 / 1.86, fixed_m4_shift 0.50 / 1.98,
full_shift 0.45 / 1.78. Training: 15 units x 1000 steps x ~0.45 s <= 111 min on 2 quiet cores
(about 7-8.5 min per unit), plus evaluation (see results/code_lm/RUN.md for its measured
time). Each unit is resumable; ``--config.sweep.order`` runs a subset, so the sweep can be run
in parts of about an hour (e.g. seed 0 and 1 of every variant first, then seed 2).
"""

from configs.sweeps import seeded_units, sweep_config, variant

SEEDS = 3
STEPS = 1000
BATCH = 8
SEQ_LEN = 256
SHARED = {
    "model.num_layers": 2,
    "model.d_model": 128,
    "model.num_heads": 4,
    "model.num_kv_heads": 4,
    "model.head_dim": 32,
    "model.mlp_dim": 512,
    "model.key_shift": 0,
    # Attention settings of the compressed kinds (full attention ignores them).
    "model.attention.window": 8,
    "model.attention.chunk_size": 4,
    "model.attention.pooling": "gated",
    "model.attention.router_rule": "start",
    "model.attention.min_chunk": 3,
    "model.attention.max_chunk": 8,
    "model.attention.boundary_group": 0,
    "model.attention.ratio_loss_weight": 10.0,  # as configs/kv_dynamic.py: holds the budget
    "data.seq_len": SEQ_LEN,
    "data.batch_size": BATCH,
    "data.code_needles": 4,
    "data.near_distance": 64,
    "train.steps": STEPS,
    "train.learning_rate": 2e-3,
    "train.warmup_steps": 50,
    "train.log_every": 50,
    "train.eval_every": 100000,  # no held-out pass during training; the sweep evaluates
    "train.eval_batches": 8,
    "train.checkpoint_every": 200,
}
BASE = "configs/lm/code_small.py"
SHIFT = {"model.key_shift": 2}
FIXED = {"model.attention.kind": "fixed"}
DYNAMIC = {"model.attention.kind": "dynamic", "model.attention.boundary": "router"}

# variant -> (its definition, number of seeds)
VARIANTS = {
    "full": (variant(BASE, {"model.attention.kind": "full"}), SEEDS),
    "fixed_m4": (variant(BASE, FIXED), SEEDS),
    "dynamic_m4": (variant(BASE, DYNAMIC), SEEDS),
    "fixed_m4_shift": (variant(BASE, {**FIXED, **SHIFT}), SEEDS),
    "full_shift": (variant(BASE, {"model.attention.kind": "full", **SHIFT}), SEEDS),
}


def get_config():
  return sweep_config(
      seeded_units(VARIANTS),
      overrides=SHARED,
      name="code_lm",
      reference_chunk_size=4,
      eval_batch_size=32,
      probes=dict(needle_sweep=dict(num_offsets=12), prefix_probe=dict(prompts=64, max_prefix=12),
                  slot_gain=dict(rows=32), lm_phase_loss=dict(batches=16)),
  )
