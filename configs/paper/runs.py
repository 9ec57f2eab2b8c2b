"""The pretraining sweep of the periodic weak-spots study: one entry per run of its table.

Every run is the same decoder (Qwen3-0.6B's shape at size ``paper``) with one attention
setting. The compressed default: windows of W tokens every S tokens (``chunk_size`` = S,
``compress_window`` = W), entry j covering tokens [jS, jS + W) (``compress_window_align =
"start"``, the paper's alignment), one payload map, gate and gate bias per offset
(``offset_maps = per_offset``), scalar gates, separate key and value compressors, Q/K RMSNorm
(compressed keys normalised, compressed values not), RoPE on every channel, and a local window
of 16 exact tokens. Each ablation changes that default in the fields it names.

Sizes (``SIZES``): ``paper`` (28 layers, width 1024, 16 query heads of dim 128, Qwen3-0.6B's
vocabulary) and ``cpu`` (2 layers, width 64, 8 query heads of dim 16) that trains in minutes
on two cores, with ``small`` (width 32) and ``large`` (3 layers, width 128) beside it for the
size trend; ``tiny`` is the test size. ``CURES`` are the study's cures on the paper's
compressor (``cure_*``, plan version 5), not runs of its table. Sizes change only ``SIZE_FIELDS``;
RoPE on a fraction of the head (16 of 128 channels) keeps that fraction at every size.
Data: size ``paper`` and ``tiny`` train on the offline byte-level ``code`` task (point ``data`` at a
corpus, ``--config.data.task=corpus --config.data.path=DIR``, for a real pretraining run);
size ``cpu`` trains on the lookup prompts themselves (task ``lookup``: 16 records of 1-token keys
and values from 32 keys and 32 values, 8 demonstrations, a target key, in rows of 128 tokens;
``chunkformer/data/lookup_rows.py``), because a model of that size does not learn in-context
lookup from text on two cores; with the paper's 64 records it had not started learning after
1000 steps. Vary ``seed``
for the replicated runs.
"""

from configs import base

LOCAL_WINDOW = 16  # exact tokens every query of a compressed model sees besides the entries
PAPER_HEAD_DIM = 128

# Field overrides per run, on top of the compressed default (``_compressed``) or, for the
# full-attention controls, of the plain decoder. Keys are dotted config paths; "rope_of_128"
# is RoPE channels out of 128, scaled to the size's head dim.
_FULL = {"model.attention.kind": "full"}


def _compressed(w: int, s: int, kv: int, **changes) -> dict:
  run = {
      "model.attention.kind": "fixed",
      "model.attention.chunk_size": s,
      "model.attention.compress_window": w,
      "model.attention.compress_window_align": "start",
      "model.attention.offset_maps": "per_offset",
      "model.attention.gate": "scalar",
      "model.attention.pooling": "gated",
      "model.attention.shared_kv": False,
      "model.attention.entry_norm": "keys",
      "model.attention.window": LOCAL_WINDOW,
      "model.num_kv_heads": kv,
  }
  run.update(changes)
  return run


def _w8s8(kv: int = 1, **changes) -> dict:
  return _compressed(8, 8, kv, **changes)


# The DeepSeek-V4 compressor: CSA's overlap (W = 2S, one map per half), vector gates, tied
# K/V, RoPE on 16 of 128 channels.
_DSV4 = {"model.attention.compress_window": 0, "model.attention.overlap": True,
         "model.attention.offset_maps": "shared", "model.attention.gate": "vector",
         "model.attention.shared_kv": True, "model.attention.entry_norm": "all",
         "rope_of_128": 16}

RUNS: dict[str, dict] = {
    "full_1kv": dict(_FULL, **{"model.num_kv_heads": 1}),
    "full_4kv": dict(_FULL, **{"model.num_kv_heads": 4}),
    "full_8kv": dict(_FULL, **{"model.num_kv_heads": 8}),
    "w8s8_1kv": _w8s8(),
    "w4s4_1kv": _compressed(4, 4, 1),
    "w8s4_1kv": _compressed(8, 4, 1),
    "w8s6_1kv": _compressed(8, 6, 1),
    "w12s12_1kv": _compressed(12, 12, 1),
    "w8s8_2kv": _w8s8(2),
    "w8s8_4kv": _w8s8(4),
    "w8s8_8kv": _w8s8(8),
    "w8s8_1kv_tied_kv": _w8s8(**{"model.attention.shared_kv": True}),
    "w8s8_1kv_uniform": _w8s8(**{"model.attention.pooling": "mean"}),
    "w8s8_1kv_uniform_tied_kv_post_norm": _w8s8(**{
        "model.attention.pooling": "mean", "model.attention.shared_kv": True,
        "model.attention.payload_norm": True}),
    "w8s8_1kv_vector": _w8s8(**{"model.attention.gate": "vector"}),
    "w8s8_1kv_no_qk_norm": _w8s8(**{"model.qk_norm": False,
                                    "model.attention.entry_norm": "none"}),
    "w8s8_1kv_no_gate_bias": _w8s8(**{"model.attention.pooling": "gated_no_bias"}),
    "w8s8_1kv_nope": _w8s8(**{"model.rope": False}),
    "w8s8_1kv_rope16": _w8s8(rope_of_128=16),
    "w8s8_1kv_tail": _w8s8(**{"model.attention.window": 0, "model.attention.tail": True}),
    "w8s8_8kv_tail": _w8s8(8, **{"model.attention.window": 0, "model.attention.tail": True}),
    "w8s4_dsv4_kernel": _compressed(8, 4, 1, **_DSV4),
    "w8s4_dsv4_kernel_scalar": _compressed(8, 4, 1, **dict(_DSV4, **{
        "model.attention.gate": "scalar"})),
}

# The cures of the study, under the paper's protocol (plan version 5,
# results/paper_plan5/PLAN.md): not runs of the paper's table, so named ``cure_*`` and kept
# apart from RUNS (the judge matches rows to the paper's runs by name). Each keeps W8/S8's
# entry budget (one entry per 8 tokens on average) except the stride-2 row.
_DYNAMIC = {
    "model.attention.kind": "dynamic", "model.attention.boundary": "router",
    "model.attention.router_rule": "start", "model.attention.chunk_size": 8,
    "model.attention.min_chunk": 4, "model.attention.max_chunk": 16,
    "model.attention.boundary_group": 0,
    # configs/kv_dynamic.py's weight: the loss covers few tokens (here 9 of 128), and a weak
    # ratio loss loses to its pull towards more entries.
    "model.attention.ratio_loss_weight": 10.0,
    # the dynamic kind's compressor: one shared gated map with vector gates (the paper's
    # per-offset scalar gates need a fixed window), keys and values separate as the paper's
    "model.attention.compress_window": 0, "model.attention.compress_window_align": "end",
    "model.attention.offset_maps": "shared", "model.attention.gate": "vector",
}
CURES: dict[str, dict] = {
    "cure_random_phase": _w8s8(**{"model.attention.random_phase": True}),
    "cure_stagger_8kv": _w8s8(8, **{"model.attention.stagger": "heads"}),
    "cure_key_shift": _w8s8(**{"model.key_shift": 2}),
    "cure_dynamic_router": _w8s8(**_DYNAMIC),
    "cure_dynamic_router_end": _w8s8(**dict(_DYNAMIC, **{
        "model.attention.router_rule": "end"})),
    "cure_dynamic_fixed": _w8s8(**dict(_DYNAMIC, **{"model.attention.boundary": "fixed"})),
    "cure_w4s2_1kv": _compressed(4, 2, 1),
}
# Every run get_run_config builds: the paper's and the cures.
ALL_RUNS: dict[str, dict] = {**RUNS, **CURES}

SIZES: dict[str, dict] = {
    "paper": {
        "model.vocab_size": 151936, "model.num_layers": 28, "model.d_model": 1024,
        "model.num_heads": 16, "model.head_dim": 128, "model.mlp_dim": 3072,
        "model.dtype": "bfloat16", "model.remat": "full", "model.scan_layers": True,
        "data.seq_len": 4096, "data.batch_size": 64, "train.steps": 20000,
        "train.learning_rate": 3e-4, "train.warmup_steps": 1000, "train.log_every": 20,
        "train.eval_every": 1000, "train.eval_batches": 4, "train.checkpoint_every": 1000,
        "mesh.data": 1, "mesh.fsdp": -1, "data.task": "code",
    },
    "cpu": {
        "model.vocab_size": 72, "model.num_layers": 2, "model.d_model": 64,
        "model.num_heads": 8, "model.head_dim": 16, "model.mlp_dim": 256,
        "model.dtype": "float32", "model.remat": "none", "model.scan_layers": False,
        "data.seq_len": 128, "data.batch_size": 8, "train.steps": 300,
        "train.learning_rate": 2e-3, "train.warmup_steps": 30, "train.log_every": 25,
        "train.eval_every": 100, "train.eval_batches": 2, "train.checkpoint_every": 100,
        "mesh.fsdp": 1, "data.task": "lookup", "data.num_pairs": 16, "data.num_symbols": 64,
        "data.lookup_demos": 8,
    },
    "tiny": {
        "model.vocab_size": 260, "model.num_layers": 1, "model.d_model": 32,
        "model.num_heads": 8, "model.head_dim": 16, "model.mlp_dim": 64,
        "model.dtype": "float32", "model.remat": "none", "model.scan_layers": False,
        "data.seq_len": 48, "data.batch_size": 2, "train.steps": 20,
        "train.learning_rate": 1e-2, "train.warmup_steps": 2, "train.log_every": 10,
        "train.eval_every": 20, "train.eval_batches": 1, "train.checkpoint_every": 20,
        "mesh.fsdp": 1, "data.task": "code",
    },
}

# The size trend of plan version 5: ``cpu`` at half the width, and at twice it with 3 layers.
SIZES["small"] = {**SIZES["cpu"], "model.d_model": 32, "model.mlp_dim": 128}
SIZES["large"] = {**SIZES["cpu"], "model.num_layers": 3, "model.d_model": 128,
                  "model.mlp_dim": 512}

# The fields sizes may change (and the RoPE channels, a fixed fraction of the head dim).
SIZE_FIELDS = frozenset().union(*SIZES.values()) | {"model.rope_dims"}


def get_run_config(run: str, size: str = "cpu"):
  """The ConfigDict of ``run`` (a key of RUNS or CURES) at ``size`` (a key of SIZES)."""
  if run not in ALL_RUNS:
    raise ValueError(f"paper run {run!r}: expected one of {', '.join(ALL_RUNS)}")
  if size not in SIZES:
    raise ValueError(f"config argument {size!r}: expected a size, one of {', '.join(SIZES)}")
  c = base.get_config()
  c.model.qk_norm = True
  c.model.rope_base = 1e6
  c.model.tie_embeddings = True
  c.train.weight_decay = 0.1
  c.update_from_flattened_dict(SIZES[size])
  fields = dict(ALL_RUNS[run])
  if "rope_of_128" in fields:  # after the size: the fraction of its head dim
    fields["model.rope_dims"] = fields.pop("rope_of_128") * c.model.head_dim // PAPER_HEAD_DIM
  c.update_from_flattened_dict(fields)
  return c


def source(run: str, size: str = "") -> str:
  """The ``--config`` value that trains ``run`` at ``size`` (default: the config's, ``cpu``):
  the one paper config, ``configs/paper/run.py``, with its argument."""
  return f"configs/paper/run.py:{run}" + (f",{size}" if size else "")
