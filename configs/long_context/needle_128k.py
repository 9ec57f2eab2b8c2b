"""The long needle test at 128K tokens on the paper's runs, each row split over 8 devices.

  python eval.py --config configs/long_context/needle_128k.py --workdir DIR
  python eval.py --config configs/long_context/needle_128k.py:full_1kv,w8s8_1kv --workdir DIR
  python eval.py --config configs/long_context/needle_128k.py:tiny,w8s4_1kv --workdir DIR

Each variant is a run of the paper's sweep (``configs/paper/runs.py``) at the paper's size
(Qwen3-0.6B's shape), trained and evaluated at T = 131,072 tokens with ``mesh.context = 8``:
every row's tokens are split over 8 devices (one host's worth of fast links), the attention
kinds on their XLA path (context parallelism runs no Pallas call), the batch over ``fsdp``
(every device the other axes leave). The probes: the long needle test (``long_needle``:
records of 2 key + 2 value tokens back to back from the start of the row to the query, the
target key within two periods of the middle, 256 prompts per residue of the target's position
mod 8, the query at a fixed position; ``chunkformer/data/long_needle.py``) and the prefix probe
(the code task's primary analysis, 8 prompts). Residues mod 8 cover strides 2, 4 and 8.

Four-token records packed back to back fill 128K tokens with 32,766 records; the paper's
prompts held 16,000 four-token records in 128K of its tokenizer's tokens, so twice as many
distractors compete here. Update batch: 8 rows of 131,072 tokens (1M tokens), 4
micro-batches of 2 rows (``train.grad_accum_steps``); 5,000 updates, the paper size's tokens.
``bench/results/scale_plan.md`` has the compiled memory per device of this setting (rows
"context 8"). On 64 devices (fsdp 8 x context 8) give each batch shard one row:
``--config.overrides.train.grad_accum_steps=1 --config.sweep.eval_batch_size=64``.

The first comma-separated name ``tiny`` or ``cpu`` selects the CPU twin of the same sweep:
that size of the runs (``configs/paper/runs.py`` SIZES) at 256 tokens over ``mesh.context =
4`` (4 devices, e.g. fake ones: XLA_FLAGS=--xla_force_host_platform_device_count=4), 64
prompts per residue (the smallest group that matches mean and variance exactly mod 8).
"""

from configs.paper import runs
from configs.sweeps import sweep_config, variant

RUNS = ("full_1kv", "w8s4_1kv", "w8s4_dsv4_kernel")  # the control, W8/S4, V4's CSA compressor
SEQ_LEN = 131_072
CONTEXT = 8
# size -> (tokens, mesh.context, needle prompts per residue, shared overrides)
SETTINGS = {
    "paper": (SEQ_LEN, CONTEXT, 256, {
        "mesh.data": 1, "data.batch_size": 8, "train.grad_accum_steps": 4, "train.steps": 5000,
        "train.warmup_steps": 250, "train.eval_every": 500, "train.checkpoint_every": 250}),
    "cpu": (256, 4, 64, {}),
    "tiny": (256, 4, 64, {}),
}


def get_config(names: str = ""):
  names = [n for n in names.split(",") if n]
  size = names.pop(0) if names and names[0] in SETTINGS else "paper"
  seq_len, context, per_residue, shared = SETTINGS[size]
  unknown = [n for n in names if n not in runs.RUNS]
  if unknown:
    raise ValueError(f"config argument: {unknown} are not paper runs; expected a size "
                     f"({', '.join(SETTINGS)}) first, then runs of {', '.join(runs.RUNS)}")
  variants = {name: variant(runs.source(name, size)) for name in names or RUNS}
  overrides = {"data.seq_len": seq_len, "mesh.context": context,
               "model.attention.implementation": "xla", **shared}
  probes = {
      "prefix_probe": {"prompts": 8},
      "long_needle": {"modulus": 8, "key_len": 2, "value_len": 2,
                      "prompts_per_residue": per_residue},
  }
  return sweep_config(variants, name=f"long needle at {seq_len} tokens, context {context}",
                      eval_batch_size=2 * context, overrides=overrides, probes=probes)
