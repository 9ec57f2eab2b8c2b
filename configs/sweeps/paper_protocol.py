"""The paper's measuring instrument on chosen models: the position-matched lookup test (both
padding modes, residues mod 24), the long needle test (residues mod 8), gate concentration,
gate cycling (W = S models) and KV-head knockouts, as probes of one sweep.

  python eval.py --config configs/sweeps/paper_protocol.py:w8s8_1kv,w12s12_1kv --workdir DIR
  python eval.py --config configs/sweeps/paper_protocol.py:runs/my_run --workdir DIR

Each comma-separated name is a run of the paper's sweep (``configs/paper/<run>.py``, trained
at its CPU size unless the workdir holds it finished already) or a finished run directory
(evaluated as it is, like ``loaded.py``). Rows are each model's ``data.seq_len`` tokens long;
the paper's 128K long needle setting is ``--config.sweep.probes.long_needle.spread=...`` on a
model trained at that length. Matching mean and variance exactly needs 576 prompts per residue
mod 24 and 64k mod 8 (``data/matched_positions.py``); results land in results.json under each
variant's ``probes`` and in ``DIR/correct/<unit>.npz``.
"""

import os

from configs.paper import runs
from configs.sweeps import sweep_config, variant

PROBES = {
    "lookup": {"modulus": 24},
    "long_needle": {"modulus": 8},
    "gate_concentration": {"rows": 32},
    "gate_cycling": {"deltas": (1, -1, 2, -2, 3, -3)},
    "head_knockout": {"modulus": 24},
}


def get_config(names: str = ""):
  if not names:
    raise ValueError("name paper runs or run directories: "
                     "--config configs/sweeps/paper_protocol.py:RUN1,RUN2")
  variants = {}
  for name in names.split(","):
    if name in runs.RUNS:
      variants[name] = variant(f"configs/paper/{name}.py")
    else:
      variants[os.path.basename(os.path.normpath(name))] = variant(checkpoint=name)
  # The built-in needle sweep and prefix probe stay on: they give each unit its primary analysis.
  builtins = dict(needle_sweep=dict(num_haystacks=16), prefix_probe=dict(prompts=16),
                  slot_gain=dict(rows=32))
  return sweep_config(variants, name="paper_protocol", eval_batch_size=32,
                      probes={**builtins, **PROBES})
