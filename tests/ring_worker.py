"""The ring exchange of full attention (mesh.context_strategy = ring) against one device.

Run by tests/test_context_ring.py in ONE fresh process with 8 fake CPU devices.
- the attention case (the default): ``attention.ring.ring_attention`` alone (GQA, documents
  across the shard edges) on context 2, 4 and 8 (``QUICK_CASES``; with ``--all_cases`` every
  one of them in both layouts, and the ring differentiated by JAX), its output and the
  gradients of a weighted sum of it against ``jax.nn.dot_product_attention`` with the dense
  document-causal mask on one device; and the collectives of the optimised HLO of its forward,
  and of its forward and backward, on context = 4, natural layout (``--hlo``).
- ``--model``: the training loss and gradients of a two-layer full-attention model on each
  mesh of ``MODEL_MESHES``, ring with and without load balancing, against one device (and the
  optimised HLO of a one-layer model's forward under context = 4, ring, with ``--hlo``).

  python tests/ring_worker.py --out ring.npz --hlo collectives.json
"""

import argparse
import functools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from chunkformer import runtime as runtime_lib  # noqa: E402
from chunkformer import sharding  # noqa: E402
from chunkformer.attention import common, context_axis, load_balance, ring  # noqa: E402
from chunkformer.config import DEFAULT_AXIS_RULES, MeshConfig  # noqa: E402
from tests import context_parallel_worker as cp  # noqa: E402

# The attention case: B rows of T tokens, H query heads over K kv heads (GQA), head dim D.
B, T, H, K, D = 2, 32, 4, 2, 8
# context 2 x tensor 4 with the kv heads left whole (K = 2 < 4, as fit_rules leaves them): each
# device's one query head picks its kv head from the ring's blocks.
HEADS_MESH = (1, 1, 2, 4)
# (data, fsdp, context, tensor), balanced, queries per tile: context 2, 4, 8, each in both
# layouts; tiles of 3 cut a hop's 4, 8 or 16 queries unevenly (the last tile padded). The
# suite runs QUICK_CASES (a compile each, 4-10 s); --all_cases adds the rest and the cases
# differentiated by JAX through the forward ring (the autodiff reference, AUTODIFF_CASES).
QUICK_CASES = ((HEADS_MESH, False, 512), ((2, 1, 4, 1), True, 3), ((1, 1, 8, 1), True, 512))
ATTENTION_CASES = QUICK_CASES + ((HEADS_MESH, True, 3), ((2, 1, 4, 1), False, 512),
                                 ((1, 1, 8, 1), False, 3))
AUTODIFF_CASES = ((HEADS_MESH, True, 3), ((1, 1, 8, 1), False, 3))
HLO_T = 64  # the HLO read of the attention alone: context 4, 16 tokens per shard
DOCUMENT_STARTS = ((0, 6, 19), (0, 11, 12, 27))  # documents cross the shard edges (4, 8, ...)
# (data, fsdp, context, tensor) of the model case: context 2, 4, 8 alone, with data 2, and
# fsdp 2 x context 2 x tensor 2 (the query heads split, the one kv head whole).
MODEL_MESHES = ((1, 1, 2, 1), (1, 1, 4, 1), (1, 1, 8, 1), (2, 1, 2, 1), (2, 1, 4, 1),
                (1, 2, 2, 2))
MODEL_LAYERS = ("kind=full", "kind=full")  # load balancing reorders tokens: full layers only


def _segments(t: int) -> np.ndarray:
  seg = np.zeros((B, t), np.int32)
  for row, starts in enumerate(DOCUMENT_STARTS):
    for doc, start in enumerate(starts):
      seg[row, start * t // T:] = doc
  return seg


def _inputs(t: int):
  keys = jax.random.split(jax.random.key(3), 4)
  q = jax.random.normal(keys[0], (B, t, H, D), jnp.float32)
  k = jax.random.normal(keys[1], (B, t, K, D), jnp.float32)
  v = jax.random.normal(keys[2], (B, t, K, D), jnp.float32)
  w = jax.random.normal(keys[3], (B, t, H, D), jnp.float32)  # weights of the scalar loss
  return q, k, v, jnp.asarray(_segments(t)), w


def _reference(q, k, v, seg):
  return jax.nn.dot_product_attention(q, k, v, mask=common.document_causal_mask(seg),
                                      implementation="xla")


def _ring(q, k, v, seg, balanced: bool, tile: int = ring.QUERY_TILE, backward: str = "ring"):
  """Ring attention under the mesh and rules in force; balanced: reordered in and out."""
  axis = context_axis.current()
  names = {"q": ("batch", "length", "heads", "head_dim"),
           "kv": ("batch", "length", "kv_heads", "head_dim"), "seg": ("batch", "length")}
  if balanced:
    q = load_balance.reorder(q, names["q"], axis)
    k, v = (load_balance.reorder(x, names["kv"], axis) for x in (k, v))
    seg = load_balance.reorder(seg, names["seg"], axis)
  o = ring.ring_attention(q, k, v, seg, axis, balanced=balanced, query_tile=tile,
                         backward=backward)
  return load_balance.reorder(o, names["q"], axis, inverse=True) if balanced else o


def _value_and_grads(attend, q, k, v, seg, w):
  def loss(q, k, v):
    o = attend(q, k, v, seg)
    return jnp.sum(o * w), o
  (_, o), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
  return o, grads


def _under_mesh(mesh_shape, devices):
  config = MeshConfig(data=mesh_shape[0], fsdp=mesh_shape[1], context=mesh_shape[2],
                      tensor=mesh_shape[3])
  mesh = sharding.make_mesh(config, devices[:int(np.prod(mesh_shape))])
  rules = DEFAULT_AXIS_RULES
  if mesh_shape == HEADS_MESH:
    rules = tuple((name, None if name == "kv_heads" else axes) for name, axes in rules)
  return mesh, sharding.normalize_rules(rules)


def case_name(mesh_shape, balanced, tile, backward="ring") -> str:
  return "x".join(map(str, mesh_shape)) + f"/balanced={balanced}/tile={tile}/{backward}"


def attention_case(devices, all_cases: bool) -> dict[str, np.ndarray]:
  q, k, v, seg, w = _inputs(T)
  arrays = {}
  o, grads = jax.jit(lambda *a: _value_and_grads(_reference, *a))(q, k, v, seg, w)
  for name, x in zip(("o", "dq", "dk", "dv"), (o, *grads), strict=True):
    arrays[f"reference/{name}"] = np.asarray(x)
  runs = [(*case, "ring") for case in (ATTENTION_CASES if all_cases else QUICK_CASES)]
  runs += [(*case, "autodiff") for case in AUTODIFF_CASES] if all_cases else []
  for mesh_shape, balanced, tile, backward in runs:
    mesh, rules = _under_mesh(mesh_shape, devices)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      attend = functools.partial(_ring, balanced=balanced, tile=tile, backward=backward)
      o, grads = jax.jit(lambda *a, f=attend: _value_and_grads(f, *a))(q, k, v, seg, w)
    case = case_name(mesh_shape, balanced, tile, backward)
    for name, x in zip(("o", "dq", "dk", "dv"), (o, *grads), strict=True):
      arrays[f"{case}/{name}"] = np.asarray(x)
  return arrays


def attention_hlo(devices) -> dict[str, list[dict]]:
  """Collectives of the optimised HLO of the ring's forward, and of its forward and backward
  (the gradients of the weighted sum), context = 4 (one process)."""
  q, k, v, seg, w = _inputs(HLO_T)
  mesh, rules = _under_mesh((1, 1, 4, 1), devices)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    forward = jax.jit(lambda *a: _ring(*a, False)).lower(q, k, v, seg).compile().as_text()
    both = jax.jit(lambda *a: _value_and_grads(lambda *b: _ring(*b, False), *a)[1]).lower(
        q, k, v, seg, w).compile().as_text()
  return {"ring": cp.collectives(forward), "ring_backward": cp.collectives(both)}


def model_case(devices) -> dict[str, np.ndarray]:
  reference = cp.make_config((1, 1, 1, 1), MODEL_LAYERS)
  params = jax.device_get(runtime_lib.build(reference, devices[:1]).fresh_state().params)
  batch = cp.make_batch(reference.model.vocab_size)
  arrays = {}
  runs = [((1, 1, 1, 1), False)] + [(m, b) for m in MODEL_MESHES for b in (False, True)]
  for mesh, balanced in runs:
    began = time.perf_counter()
    strategy = "ring" if mesh[2] > 1 else "all_gather"
    config = cp.make_config(mesh, MODEL_LAYERS, strategy=strategy, balance=balanced)
    loss, grads = cp.loss_and_grads(config, devices[:int(np.prod(mesh))], params, batch)
    name = "x".join(map(str, mesh)) + ("/balanced" if balanced else "")
    print(f"mesh {name}: {time.perf_counter() - began:.1f} s", flush=True)
    arrays[f"{name}/loss"] = np.float64(loss)
    for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
      arrays[f"{name}/grad{jax.tree_util.keystr(path)}"] = g
  return arrays


def model_hlo(devices) -> dict[str, list[dict]]:
  """Collectives of a one-layer full model's optimised forward under context = 4, ring."""
  out = {}
  for balanced in (False, True):
    config = cp.make_config((1, 1, 4, 1), MODEL_LAYERS[:1], cp.HLO_SEQ_LEN, strategy="ring",
                            balance=balanced)
    out[f"ring_balanced={balanced}"] = cp.one_layer_collectives(config, devices[:4])
  return out


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", required=True)
  parser.add_argument("--hlo", default="")
  parser.add_argument("--model", action="store_true", help="the model case (slow)")
  parser.add_argument("--all_cases", action="store_true",
                      help="the attention case on every mesh and layout, and autodiff")
  args = parser.parse_args()
  devices = jax.devices()
  assert len(devices) == 8, devices
  # The equality cases skip XLA's optimisations (their compiles are the cost); the HLO read is
  # the optimised one.
  jax.config.update("jax_disable_most_optimizations", True)
  arrays = model_case(devices) if args.model else attention_case(devices, args.all_cases)
  np.savez(args.out, **arrays)
  if args.hlo:
    jax.config.update("jax_disable_most_optimizations", False)
    hlo = model_hlo(devices) if args.model else attention_hlo(devices)
    with open(args.hlo, "w") as f:
      json.dump(hlo, f)


if __name__ == "__main__":
  main()
