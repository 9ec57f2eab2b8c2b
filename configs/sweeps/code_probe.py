"""The study's '=' experiment on byte-level code models: full attention vs fixed M = 4.

  python eval.py --config configs/sweeps/code_probe.py --workdir runs/code_probe

Both models train on the standard library's code with 4 planted key-value needle lines per
row (``KEY_xxxx = "vvvv"``, asked again at the row end). Evaluation: the prefix probe on
held-out files, N = 0..12 '=' bytes after BOS, scoring the 4 answer bytes of every needle
(and the byte accuracy on the code itself); the table reads accuracy against N mod 4.
"""

from configs.sweeps import sweep_config, variant

SHARED = {
    "model.num_layers": 2,
    "model.d_model": 128,
    "model.num_heads": 4,
    "model.num_kv_heads": 4,
    "model.head_dim": 32,
    "model.mlp_dim": 512,
    "data.seq_len": 256,
    "data.batch_size": 16,
    "data.code_needles": 4,
    "data.near_distance": 64,
    "train.steps": 2000,
    "train.learning_rate": 2e-3,
    "train.warmup_steps": 100,
    "train.log_every": 100,
    "train.eval_every": 100000,
    "train.checkpoint_every": 500,
}


def get_config():
  return sweep_config(
      {
          "code_full": variant("configs/code_full.py", {"model.key_shift": 2}),
          "code_fixed_m4": variant("configs/code_full.py", {
              "model.attention.kind": "fixed", "model.attention.chunk_size": 4,
              "model.attention.window": 8}),
      },
      overrides=SHARED,
      name="code_probe",
      reference_chunk_size=4,
      eval_batch_size=32,
      probes=dict(needle_sweep=dict(num_offsets=12), prefix_probe=dict(prompts=64, max_prefix=12),
                  slot_gain=dict(rows=32)),
  )
