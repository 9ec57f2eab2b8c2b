"""The dynamic kind's pooling with the tokens split over the context axis against one device's.

Run by tests/test_dynamic_context.py in ONE fresh process with 8 fake CPU devices. For rows
whose chunks (min 3, max 16 tokens) cross shard edges, some spanning more than one edge, and
whose documents cross them too, it pools with ``chunkformer.attention.dynamic_context.pool``
on each mesh of ``MESHES`` (data x context) and with ``kernels.segment_pool`` on one device,
and writes the entries and the gradients of a random projection of them to ``--out`` (npz),
with the edges each row's chunks span.

  python tests/dynamic_context_worker.py --out pooled.npz
"""

import argparse
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

import kernels  # noqa: E402
from chunkformer import chunking  # noqa: E402
from chunkformer.attention import context_axis, dynamic_context  # noqa: E402

BATCH, SEQ_LEN, CHANNELS, SLOTS = 2, 48, 5, 16
MIN_CHUNK, MAX_CHUNK = 3, 16  # at context 8 (6 tokens per shard) a chunk spans up to 3 edges
MESHES = ((1, 8), (2, 4))  # (data, context)
DOCUMENT_STARTS = ((0, 13, 37), (0, 5, 30, 43))
RULES = (("batch", "data"), ("length", "context"))


def make_inputs():
  rng = np.random.default_rng(0)
  segment_ids = np.zeros((BATCH, SEQ_LEN), np.int32)
  for row, starts in enumerate(DOCUMENT_STARTS):
    for doc, start in enumerate(starts):
      segment_ids[row, start:] = doc
  # Few proposals, so that max_chunk closes long chunks that span several shards.
  proposals = rng.random((BATCH, SEQ_LEN)) < 0.2
  ends = _enforce(jnp.asarray(proposals), jnp.asarray(segment_ids), None)
  return dict(proposals=proposals,
              values=rng.normal(size=(BATCH, SEQ_LEN, CHANNELS)).astype(np.float32),
              logits=rng.normal(size=(BATCH, SEQ_LEN, CHANNELS)).astype(np.float32),
              slot_bias=rng.normal(size=(SLOTS, CHANNELS)).astype(np.float32),
              ends=np.asarray(ends), segment_ids=segment_ids)


@functools.partial(jax.jit, static_argnums=2)
def _enforce(proposals, segment_ids, axis):
  return chunking.enforce_lengths(proposals, segment_ids, min_chunk=MIN_CHUNK,
                                  max_chunk=MAX_CHUNK, axis=axis)


def pooled_and_grads(inputs, capacity, pool):
  """(entries, d<entries, probe>/d(values, logits, slot_bias)) of one pooling function."""
  probe = jax.random.normal(jax.random.key(1), (BATCH, capacity, CHANNELS))

  def f(values, logits, slot_bias, ends, segment_ids):
    structure = kernels.chunk_structure(ends, segment_ids, capacity)
    entries = pool(values, logits, structure, slot_bias)
    return jnp.sum(entries * probe), entries

  args = (inputs["values"], inputs["logits"], inputs["slot_bias"], inputs["ends"],
          inputs["segment_ids"])
  (_, entries), grads = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))(*args)
  return [np.asarray(entries)] + [np.asarray(g) for g in grads]


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", required=True)
  args = parser.parse_args()
  devices = jax.devices()
  assert len(devices) == 8, devices
  jax.config.update("jax_disable_most_optimizations", True)  # the compiles are the cost
  inputs = make_inputs()
  capacity = chunking.entry_capacity(SEQ_LEN, MIN_CHUNK)
  names = ("entries", "d_values", "d_logits", "d_slot_bias")

  def one_device(v, z, structure, bias):
    return kernels.segment_pool(v, z, inputs["ends"], inputs["segment_ids"], capacity=capacity,
                                slot_bias_SxN=bias, structure=structure)[0]

  arrays = {"one/ends": inputs["ends"]}
  arrays.update(zip([f"one/{n}" for n in names], pooled_and_grads(inputs, capacity, one_device),
                    strict=True))
  for data, context in MESHES:
    mesh = jax.make_mesh((data, context), ("data", "context"), devices=devices[:data * context],
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
      axis = context_axis.current()
      assert axis is not None and axis.size == context, axis
      put = {k: jax.device_put(v, NamedSharding(mesh, PartitionSpec(
          *context_axis.spec(("batch", "length", None)[:v.ndim]))))
             for k, v in inputs.items() if k != "slot_bias"}
      sharded = dict(inputs, **put)

      def split(v, z, structure, bias, axis=axis):
        return dynamic_context.pool(v, z, structure, bias, axis, MIN_CHUNK)

      results = pooled_and_grads(sharded, capacity, split)
      # The length rules run per shard, the composed state maps exchanged.
      arrays[f"{data}x{context}/ends"] = np.asarray(
          _enforce(sharded["proposals"], sharded["segment_ids"], axis))
    arrays.update({f"{data}x{context}/{n}": r for n, r in zip(names, results, strict=True)})
  # Edges crossed by each closed chunk at context 8: first and last token's shard differ.
  structure = kernels.chunk_structure(jnp.asarray(inputs["ends"]),
                                      jnp.asarray(inputs["segment_ids"]), capacity)
  valid = np.asarray(structure.entry_ends_BxC) != kernels.PAD_END
  shard = SEQ_LEN // 8
  spans = (np.asarray(structure.entry_ends_BxC) // shard
           - np.asarray(structure.entry_starts_BxC) // shard)
  arrays["edges_spanned"] = np.where(valid, spans, 0)
  np.savez(args.out, **arrays)


if __name__ == "__main__":
  main()
