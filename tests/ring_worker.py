"""The ring exchange of full attention (mesh.context_strategy = ring) against one device.

Run by tests/test_context_ring.py in ONE fresh process with 8 fake CPU devices.
- ``--attention``: ``attention.ring.ring_attention`` alone (GQA, documents across the shard
  edges), load-balanced on data 2 x context 4 and in the natural layout on context 2 x tensor 4
  with the kv heads unsplit, its output and the
  gradients of a weighted sum of it against ``jax.nn.dot_product_attention`` with the dense
  document-causal mask on one device; and the collectives of the optimised HLO of its forward
  on context = 4, natural layout (``--hlo``).
- ``--model``: the training loss and gradients of a two-layer full-attention model on each
  mesh of ``MODEL_MESHES``, ring with and without load balancing, against one device (and the
  optimised HLO of a one-layer model's forward under context = 4, ring, with ``--hlo``).

  python tests/ring_worker.py --attention --out ring.npz --hlo collectives.json
"""

import argparse
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
ATTENTION_MESH = (2, 1, 4, 1)  # data 2 x context 4: 8 tokens per shard, chunks of 4 balanced
# context 2 x tensor 4 with the kv heads left whole (K = 2 < 4, as fit_rules leaves them): each
# device's one query head picks its kv head from the ring's blocks. Two cases keep the suite's
# compiles few: balanced on ATTENTION_MESH, natural on HEADS_MESH (the model case has both
# layouts on every mesh).
HEADS_MESH = (1, 1, 2, 4)
HLO_T = 64  # the HLO read of the attention alone: context 4, 16 tokens per shard
DOCUMENT_STARTS = ((0, 6, 19), (0, 11, 12, 27))  # documents cross the shard edges (8, 16, 24)
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


def _ring(q, k, v, seg, balanced: bool):
  """Ring attention under the mesh and rules in force; balanced: reordered in and out."""
  axis = context_axis.current()
  names = {"q": ("batch", "length", "heads", "head_dim"),
           "kv": ("batch", "length", "kv_heads", "head_dim"), "seg": ("batch", "length")}
  if balanced:
    q = load_balance.reorder(q, names["q"], axis)
    k, v = (load_balance.reorder(x, names["kv"], axis) for x in (k, v))
    seg = load_balance.reorder(seg, names["seg"], axis)
  o = ring.ring_attention(q, k, v, seg, axis, balanced=balanced)
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


def attention_case(devices) -> dict[str, np.ndarray]:
  q, k, v, seg, w = _inputs(T)
  arrays = {}
  o, grads = jax.jit(lambda *a: _value_and_grads(_reference, *a))(q, k, v, seg, w)
  for name, x in zip(("o", "dq", "dk", "dv"), (o, *grads), strict=True):
    arrays[f"reference/{name}"] = np.asarray(x)
  for mesh_shape, balanced in ((ATTENTION_MESH, True), (HEADS_MESH, False)):
    mesh, rules = _under_mesh(mesh_shape, devices)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      fn = jax.jit(lambda *a, b=balanced: _value_and_grads(
          lambda q, k, v, s: _ring(q, k, v, s, b), *a))
      o, grads = fn(q, k, v, seg, w)
    case = "x".join(map(str, mesh_shape)) + f"/balanced={balanced}"
    for name, x in zip(("o", "dq", "dk", "dv"), (o, *grads), strict=True):
      arrays[f"{case}/{name}"] = np.asarray(x)
  return arrays


def attention_hlo(devices) -> dict[str, list[dict]]:
  """Collectives of the optimised HLO of the ring's forward, context = 4 (one process)."""
  q, k, v, seg, _ = _inputs(HLO_T)
  mesh, rules = _under_mesh((1, 1, 4, 1), devices)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    hlo = jax.jit(lambda *a: _ring(*a, False)).lower(q, k, v, seg).compile().as_text()
  return {"ring": cp.collectives(hlo)}


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
  args = parser.parse_args()
  devices = jax.devices()
  assert len(devices) == 8, devices
  # The equality cases skip XLA's optimisations (their compiles are the cost); the HLO read is
  # the optimised one.
  jax.config.update("jax_disable_most_optimizations", True)
  np.savez(args.out, **(model_case(devices) if args.model else attention_case(devices)))
  if args.hlo:
    jax.config.update("jax_disable_most_optimizations", False)
    hlo = model_hlo(devices) if args.model else attention_hlo(devices)
    with open(args.hlo, "w") as f:
      json.dump(hlo, f)


if __name__ == "__main__":
  main()
