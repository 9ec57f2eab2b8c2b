"""Loss and gradients of each attention kind on context-parallel meshes, and one layer's HLO.

Run by tests/test_context_parallel.py in ONE fresh process with 8 fake CPU devices (the device
count must be fixed before JAX starts). It computes the training loss and the
gradients of a model with one layer per attention kind, on one device and on each mesh of
``MESHES`` (data, fsdp, context, tensor), from the same parameters and the same batch, whose
documents cross the shard edges, and writes them to ``--out`` (npz). It also compiles a
one-layer model's forward under context = 4 for the full and the fixed kind and writes the
collectives of its optimised HLO to ``--hlo`` (JSON).

  python tests/context_parallel_worker.py --out grads.npz --hlo collectives.json
"""

import argparse
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from chunkformer import config as config_lib  # noqa: E402
from chunkformer import objective  # noqa: E402
from chunkformer import runtime as runtime_lib  # noqa: E402
from configs import smoke  # noqa: E402

SEQ_LEN = 48  # 6 tokens per shard at context = 8: chunks of 4 straddle the shard edges
# The communication table's row length: its 48 query blocks of W = 8 tokens split evenly over
# context = 4 (at SEQ_LEN the 6 blocks do not, and GSPMD gathers whole raw-token arrays instead).
HLO_SEQ_LEN = 384
WINDOW, STRIDE, HEAD_DIM = 8, 4, 16
BATCH = 2
# Document starts per row (positions restart there): every row has documents crossing edges.
DOCUMENT_STARTS = ((0, 13, 37), (0, 5, 30, 43))

# One model, one layer per attention kind (a failing kind shows in its own layer's gradients):
# full; fixed plain; fixed overlapping (CSA); DeepSeek-V4 layout with the lightning indexer's
# top-k; the paper's general windows (W6/S4, W10/S4); dynamic with the learned router; dynamic
# with the delimiter rule.
LAYERS = {
    "full": "kind=full",
    "fixed": f"kind=fixed,window={WINDOW}",
    "overlap": f"kind=fixed,window={WINDOW},overlap=true",
    "v4_indexer": f"kind=fixed,window={WINDOW},overlap=true,layout=deepseek_v4,sink=true,"
                  "indexer=lightning,topk=4",
    # The paper's compressor family: windows of W tokens every S, W not a multiple of S;
    # W = 10 reaches back past the previous shard (6 tokens per shard at context = 8).
    "w6s4": f"kind=fixed,window={WINDOW},compress_window=6,offset_maps=per_offset,gate=scalar",
    "w10s4": f"kind=fixed,window={WINDOW},compress_window=10,offset_maps=per_offset,"
             "gate=scalar,shared_kv=false,compress_window_align=start",
    "dynamic_router": f"kind=dynamic,window={WINDOW},boundary=router",
    "dynamic_delimiter": f"kind=dynamic,window={WINDOW},boundary=delimiter,delimiters=5",
}
# (data, fsdp, context, tensor): context 8 alone, 4 with data, 2 with fsdp and tensor. Each
# mesh is one compile of the eight-layer step, the cost of this test.
MESHES = ((1, 1, 8, 1), (2, 1, 4, 1), (1, 2, 2, 2))
COLLECTIVES = ("all-gather", "all-reduce", "collective-permute", "all-to-all", "reduce-scatter")


def make_config(mesh: tuple[int, int, int, int], layers: tuple[str, ...] = tuple(LAYERS.values()),
                seq_len: int = SEQ_LEN, strategy: str = "all_gather", balance: bool = False):
  """The smoke model with one layer per entry of ``layers``, on ``mesh`` (full attention's K/V
  by ``strategy``, ``balance``: the ring's load balancing)."""
  c = smoke.get_config()
  c.mesh.context_strategy, c.mesh.context_load_balance = strategy, balance
  c.model.num_layers = len(layers)
  c.model.num_kv_heads = 1  # DeepSeek-V4's MQA; tensor still splits the query heads
  c.model.head_dim = HEAD_DIM
  c.model.layer_pattern = ";".join(layers)
  a = c.model.attention
  a.chunk_size, a.min_chunk, a.max_chunk, a.boundary_group = STRIDE, 3, 8, 1
  a.query_rank, a.output_rank, a.output_groups = 16, 16, 2  # V4 layout's low ranks
  a.index_heads, a.index_head_dim = 2, 16
  c.data.seq_len, c.data.batch_size = seq_len, BATCH
  c.mesh.data, c.mesh.fsdp, c.mesh.context, c.mesh.tensor = mesh
  return config_lib.from_dict(c.to_dict())


def make_batch(vocab_size: int) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, vocab_size, (BATCH, SEQ_LEN + 1)).astype(np.int32)
  segment_ids = np.zeros((BATCH, SEQ_LEN), np.int32)
  positions = np.zeros((BATCH, SEQ_LEN), np.int32)
  for row, starts in enumerate(DOCUMENT_STARTS):
    for doc, (start, end) in enumerate(zip(starts, starts[1:] + (SEQ_LEN,), strict=True)):
      segment_ids[row, start:end] = doc
      positions[row, start:end] = np.arange(end - start)
  loss_mask = np.ones((BATCH, SEQ_LEN), np.float32)
  loss_mask[:, ::7] = 0.0  # some unscored tokens, as the tasks have
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "positions": positions,
          "segment_ids": segment_ids, "loss_mask": loss_mask}


def loss_and_grads(config, devices, params, batch):
  """(loss, gradients) of one training step's loss under ``config.mesh``, as numpy."""
  rt = runtime_lib.build(config, devices)
  params = jax.device_put(params, rt.state_shardings.params)
  batch = {k: jax.device_put(v, rt.batch_sharding) for k, v in batch.items()}
  rng = jax.random.key(7)

  def step(p, b):
    (loss, _), grads = jax.value_and_grad(objective.loss_fn, has_aux=True)(p, rt.model, b, rng)
    return loss, grads

  with rt.context():
    loss, grads = jax.jit(step)(params, batch)
  return float(loss), jax.tree.map(np.asarray, grads)


def collectives(hlo: str) -> list[dict]:
  """Every collective of a compiled HLO module: op, result shape, elements."""
  found = []
  pattern = r"= (\w+)\[([\d,]*)\][^=]*? (" + "|".join(COLLECTIVES) + r")(?:-start)?\("
  for dtype, dims, op in re.findall(pattern, hlo):
    shape = [int(d) for d in dims.split(",") if d]
    found.append({"op": op, "dtype": dtype, "shape": shape, "elements": int(np.prod(shape))})
  return found


def one_layer_forward_collectives(layer: str, devices) -> list[dict]:
  """Collectives of a one-layer model's forward under context = 4, rows of HLO_SEQ_LEN."""
  return one_layer_collectives(make_config((1, 1, 4, 1), (layer,), HLO_SEQ_LEN), devices)


def one_layer_collectives(config, devices) -> list[dict]:
  """Collectives of the optimised forward of ``config``'s model on ``devices``."""
  rt = runtime_lib.build(config, devices)
  seq_len = config.data.seq_len
  abstract = {k: jax.ShapeDtypeStruct((BATCH, seq_len), v.dtype, sharding=rt.batch_sharding)
              for k, v in make_batch(config.model.vocab_size).items()}

  def forward(p, b):
    return rt.model.apply({"params": p}, b["inputs"], b["positions"], b["segment_ids"],
                          mutable=objective.AUX_COLLECTIONS)[0]

  with rt.context():
    hlo = jax.jit(forward).lower(rt.abstract_state.params, abstract).compile().as_text()
  return collectives(hlo)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", required=True)
  parser.add_argument("--hlo", default="", help="also read one layer's HLO (full, fixed)")
  args = parser.parse_args()
  devices = jax.devices()
  assert len(devices) == 8, devices
  # The equality cases skip XLA's optimisations (their compiles are this test's cost); the
  # HLO read for the communication table below is the optimised one.
  jax.config.update("jax_disable_most_optimizations", True)
  reference = make_config((1, 1, 1, 1))
  params = jax.device_get(runtime_lib.build(reference, devices[:1]).fresh_state().params)
  batch = make_batch(reference.model.vocab_size)
  arrays = {}
  for mesh in ((1, 1, 1, 1),) + MESHES:
    began = time.perf_counter()
    loss, grads = loss_and_grads(make_config(mesh), devices[:int(np.prod(mesh))], params, batch)
    name = "x".join(map(str, mesh))
    print(f"mesh {name}: {time.perf_counter() - began:.1f} s", flush=True)
    arrays[f"{name}/loss"] = np.float64(loss)
    for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
      arrays[f"{name}/grad{jax.tree_util.keystr(path)}"] = g
  np.savez(args.out, **arrays)
  if not args.hlo:
    return
  jax.config.update("jax_disable_most_optimizations", False)
  hlo = {name: one_layer_forward_collectives(LAYERS[name], devices[:4])
         for name in ("full", "fixed")}
  with open(args.hlo, "w") as f:
    json.dump(hlo, f)


if __name__ == "__main__":
  main()
