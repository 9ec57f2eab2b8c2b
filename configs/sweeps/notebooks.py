"""The demo sweep (configs/sweeps/demo.py) cut down for the notebooks in notebooks/.

  python eval.py --config configs/sweeps/notebooks.py:quickstart --workdir runs/demo
  python eval.py --config configs/sweeps/notebooks.py:anatomy,fast --workdir /tmp/anatomy

The argument is ``<notebook>[,fast]``:
- ``quickstart``: full attention and fixed M = 4 (the demo's seed 0), needle sweep at the far
  depth only (the depth the demo's table reads), no prefix probe, no slot gains;
- ``anatomy``: fixed M = 4 and the learned dynamic chunks (budget 4; seed 0), far depth, slot gains;
- ``fast``: the sizes CI runs with CHUNKFORMER_FAST=1 (seconds of training; the numbers then
  mean nothing, the cells run the same code).
Without ``fast`` every variant is the demo's own (same train config, overrides and seed), so
``runs/demo/<variant>`` is shared: a run finished by ``./run.sh demo`` is not retrained by a
notebook, and a variant a notebook trained is not retrained by the demo.
"""

from configs.sweeps import demo, sweep_config

NOTEBOOKS = {  # the demo's units (seed 0), and the slot-gain rows (None: no slot gains)
    "quickstart": dict(order=("full_seed0", "fixed_m4_seed0"), slot_gain=None),
    "anatomy": dict(order=("fixed_m4_seed0", "dynamic_m4_seed0"), slot_gain=dict(rows=64)),
}
# Tiny model and rows for CI: every code path runs, training only takes seconds.
FAST_OVERRIDES = {
    "model.d_model": 32,
    "model.num_heads": 2,
    "model.num_kv_heads": 2,
    "model.mlp_dim": 64,
    "data.seq_len": 48,
    "data.batch_size": 8,
    "data.num_pairs": 3,
    "data.num_queries": 2,
    "data.near_distance": 12,
    "train.steps": 12,
    "train.warmup_steps": 2,
    "train.log_every": 6,
    "train.checkpoint_every": 12,
    "train.eval_batches": 1,
}
FAST_SETTINGS = dict(eval_batch_size=48, num_resamples=200, num_permutations=200)
FAST_PROBES = dict(needle_sweep=dict(num_offsets=12, num_haystacks=4), slot_gain=dict(rows=8))


def get_config(arg: str = "quickstart"):
  name, *flags = [part.strip() for part in arg.split(",")]
  if name not in NOTEBOOKS or any(flag != "fast" for flag in flags):
    raise ValueError(f"argument {arg!r}: expected '<notebook>[,fast]' with notebook one of "
                     f"{', '.join(NOTEBOOKS)}")
  config = demo.get_config()
  overrides = dict(demo.SHARED)
  notebook = NOTEBOOKS[name]
  # The demo's needle sweep at the far depth only; no prefix probe.
  probes = {"needle_sweep": dict(config.sweep.probes.needle_sweep.to_dict(), depths=(0.0,))}
  if notebook["slot_gain"] is not None:
    probes["slot_gain"] = notebook["slot_gain"]
  settings = dict(config.sweep.to_dict(), name=name, order=notebook["order"])
  if flags:
    overrides.update(FAST_OVERRIDES)
    settings.update(FAST_SETTINGS)
    probes = {k: {**v, **FAST_PROBES[k]} for k, v in probes.items()}
  settings["probes"] = probes
  variants = {v: config.variants[v] for v in settings["order"]}
  return sweep_config(variants, overrides=overrides, **settings)
