"""What the sweeps of trained models under an inference-time setting share: the eviction sweep
(configs/sweeps/eviction.py, eviction policies) and the sparse-prefill sweep
(configs/sweeps/sparse_prefill.py, sparse prefill patterns) evaluate the same models with one
probe each, read by ``evaluation.probes.policy_needles``.

One block per thing they share, each built by one call:
- ``models``: three seeds of the full-attention kv model with 2-token keys and values and keys
  and queries shifted by 3 (``configs/kv_full.py`` with ``SHARED``: the study's ``SHARED``,
  600 steps by the budget rule of configs/sweeps/eviction.py's docstring);
- ``full``: the sweep around them, the plain needle sweep and the study's probe on the same
  needles (its own options given by the sweep, the batch of 64 added);
- ``tiny``: the pipeline in seconds (tests/test_eviction_sweep.py,
  tests/test_sparse_prefill_sweep.py): a 1-layer smoke model (1-token needles in 32 tokens), 2
  steps, the study's probe on 12 offsets in 2 haystacks; nothing it finds is a result;
- ``get_config``: a sweep file's ``get_config(arg)``: ``tiny``, or ``full``.
A name ``sweep_config`` does not know is refused by it (naming the setting), an option the
probe does not take by the probe registry before anything trains.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from configs.sweeps import seeded_units, study, sweep_config, variant

STEPS = 600  # the budget rule of configs/sweeps/eviction.py's docstring
KV2 = {"data.key_len": 2, "data.value_len": 2}
QK_SHIFT3 = {"model.key_shift": 3, "model.query_shift": True}
SHARED = {**study.SHARED, **KV2, **QK_SHIFT3, "train.steps": STEPS}
SEEDS = 3
UNIT = "full_kv2_qk3"
# The tiny check's model and needles.
TINY_MODEL = {"model.num_layers": 1, "train.steps": 2, "train.checkpoint_every": 2}
TINY_NEEDLES = dict(num_offsets=12, num_haystacks=2)


def models(seeds: int = SEEDS) -> dict[str, ml_collections.ConfigDict]:
  """The units both sweeps evaluate: ``full_kv2_qk3_seed<k>`` for k < ``seeds``."""
  return seeded_units({UNIT: (variant("configs/kv_full.py"), seeds)})


def full(name: str, probe: str, needles: dict[str, Any],
         **options: Any) -> ml_collections.ConfigDict:
  """The sweep ``name`` on ``models()``: the plain needle sweep on ``needles`` and ``probe``
  with its ``options`` on the same needles."""
  return sweep_config(
      models(), overrides=SHARED, name=name, reference_chunk_size=4, eval_batch_size=64,
      probes={"needle_sweep": needles, probe: dict(options, batch_size=64, **needles)})


def tiny(name: str, probe: str, **options: Any) -> ml_collections.ConfigDict:
  """The pipeline check ``<name>_tiny`` of ``probe`` with its ``options`` (module docstring)."""
  model = variant("configs/smoke.py", TINY_MODEL)
  return sweep_config(
      seeded_units({"tiny": (model, 1)}), name=f"{name}_tiny", eval_batch_size=16,
      num_resamples=20, num_permutations=20,
      probes={"needle_sweep": dict(TINY_NEEDLES, depths=(0.0,)),
              probe: dict(options, phase_sizes=(4,), batch_size=16, **TINY_NEEDLES)})


def get_config(path: str, arg: str, name: str, probe: str, needles: dict[str, Any],
               tiny_options: dict[str, Any], **options: Any) -> ml_collections.ConfigDict:
  """The config of the sweep file ``path`` for its argument: none (``full`` with
  ``options``) or 'tiny' (``tiny`` with ``tiny_options``)."""
  if arg == "tiny":
    return tiny(name, probe, **tiny_options)
  if arg:
    raise ValueError(f"{path} takes no argument or 'tiny', got {arg!r}")
  return full(name, probe, needles, **options)
