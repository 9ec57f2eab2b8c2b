"""Periodicity sweep of finished run directories: imported models and runs continued from them.

  python eval.py --config configs/sweeps/loaded.py:runs/qwen3_0p6b,runs/qwen3_m4 \\
      --workdir runs/qwen3_sweep [--config.sweep.probes.needle_sweep.num_haystacks=64]

Each comma-separated run directory is one variant (named by its directory), evaluated as
trained: the needle shift sweep and the prefix probe on kv rows of the run's ``data`` config,
spoken in the model's own tokens when it was imported with a tokenizer
(``chunkformer/run_tokens.py``); offsets and phases count tokens. Nothing is trained.
"""

import os

from configs.sweeps import sweep_config, variant


def get_config(runs: str = ""):
  if not runs:
    raise ValueError("name the run directories: --config configs/sweeps/loaded.py:RUN1,RUN2")
  variants = {os.path.basename(os.path.normpath(run)): variant(checkpoint=run)
              for run in runs.split(",")}
  return sweep_config(variants, name="loaded", eval_batch_size=32,
                      probes=dict(needle_sweep=dict(num_haystacks=32),
                                  prefix_probe=dict(prompts=32), slot_gain=dict(rows=64)))
