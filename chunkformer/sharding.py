"""Device mesh, logical-axis rules and the shardings of parameters and batches.

Model code names axes logically (``embed``, ``heads``, ...); ``config.mesh.axis_rules`` maps
those names onto the mesh axes ``data``, ``fsdp``, ``context`` and ``tensor`` (``context``
splits the token dimension ``length`` of the batch and of every activation: context
parallelism). A mesh axis that does not divide a dimension carrying its logical name
(``kv_heads = 1`` over ``tensor = 2``) is dropped from that logical name's rule for the whole
run, so parameters and the activation constraints inside the model agree; the drop is logged
once. Batches are never silently replicated: a
global batch that the batch axes do not divide is a ConfigError.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from absl import logging
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from chunkformer.config import ConfigError, MeshConfig

MESH_AXES = ("data", "fsdp", "context", "tensor")  # context next to tensor: both talk most
BATCH_AXES = ("batch", "length")  # logical names of a [B, T] input array

Rules = tuple[tuple[str, Any], ...]


def make_mesh(mesh_config: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A (data, fsdp, context, tensor) mesh over all devices (of every process) unless given."""
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_config.shape(len(devices))
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                       devices=devices)


def normalize_rules(rules) -> Rules:
  """Rules as hashable tuples (a JSON round trip turns the inner tuples into lists)."""
  out = []
  for name, axes in rules:
    if isinstance(axes, (list, tuple)):
      axes = tuple(axes)
      for axis in axes:
        if axis not in MESH_AXES:
          raise ConfigError(f"config field 'mesh.axis_rules': {name!r} maps to unknown mesh "
                            f"axis {axis!r}; mesh axes: {', '.join(MESH_AXES)}")
    elif axes is not None and axes not in MESH_AXES:
      raise ConfigError(f"config field 'mesh.axis_rules': {name!r} maps to unknown mesh axis "
                        f"{axes!r}; mesh axes: {', '.join(MESH_AXES)}")
    out.append((str(name), axes))
  return tuple(out)


def _as_tuple(axes) -> tuple[str, ...]:
  if axes is None:
    return ()
  return tuple(axes) if isinstance(axes, tuple) else (axes,)


def _is_boxed(x) -> bool:
  return isinstance(x, nn.LogicallyPartitioned)


def fit_rules(abstract_boxed: Any, mesh: Mesh, rules) -> Rules:
  """Drops, per logical name, the mesh axes that do not divide every dimension it names.

  ``abstract_boxed`` is a tree whose leaves are ``nn.LogicallyPartitioned`` boxes (e.g. the
  ``jax.eval_shape`` of an init function). Mesh axes are kept left to right while their running
  product divides all the sizes; the rest are dropped and logged.
  """
  rules = normalize_rules(rules)
  sizes: dict[str, set[int]] = {}
  for leaf in jax.tree.leaves(abstract_boxed, is_leaf=_is_boxed):
    if _is_boxed(leaf):
      for name, size in zip(leaf.names, leaf.value.shape, strict=True):
        if name is not None:
          sizes.setdefault(name, set()).add(size)
  fitted = []
  for name, axes in rules:
    kept, product = [], 1
    for axis in _as_tuple(axes):
      n = mesh.shape[axis]
      if all(size % (product * n) == 0 for size in sizes.get(name, ())):
        kept.append(axis)
        product *= n
      else:
        logging.warning("sharding: mesh axis %r (size %d) does not divide logical axis %r "
                        "(sizes %s); %r is left unsharded over %r", axis, n, name,
                        sorted(sizes[name]), name, axis)
    fitted.append((name, kept[0] if len(kept) == 1 else (tuple(kept) if kept else None)))
  return tuple(fitted)


def shardings_of(abstract_boxed: Any, mesh: Mesh, rules: Rules) -> Any:
  """NamedShardings for the unboxed version of ``abstract_boxed`` (unnamed leaves replicate)."""
  specs = nn.get_partition_spec(abstract_boxed)
  return nn.logical_to_mesh_sharding(specs, mesh, rules)


def batch_sharding(mesh: Mesh, rules: Rules) -> NamedSharding:
  return NamedSharding(mesh, nn.logical_to_mesh_axes(BATCH_AXES, rules))


def check_batch(batch_size: int, sharding: NamedSharding, field: str = "data.batch_size") -> None:
  """ConfigError unless the batch axes divide ``batch_size`` and every process gets whole rows."""
  spec = sharding.spec[0] if len(sharding.spec) else None
  shards = math.prod(sharding.mesh.shape[a] for a in _as_tuple(spec))
  if batch_size % shards:
    raise ConfigError(f"config field '{field}': {batch_size} rows do not split over the "
                      f"{shards} batch shards of the mesh {dict(sharding.mesh.shape)}")
  if batch_size % jax.process_count():
    raise ConfigError(f"config field '{field}': {batch_size} rows do not split over "
                      f"{jax.process_count()} processes")


def process_rows(sharding: NamedSharding, global_shape: tuple[int, ...]) -> tuple[int, int]:
  """(index, count): this process feeds block ``index`` of ``count`` equal row blocks.

  Derived from the devices this process addresses, so it stays right when the mesh replicates
  the batch across processes (then several processes feed the same block).
  """
  intervals = set()
  for index in sharding.addressable_devices_indices_map(global_shape).values():
    rows = index[0]
    intervals.add((rows.start or 0, global_shape[0] if rows.stop is None else rows.stop))
  start, stop = min(s for s, _ in intervals), max(e for _, e in intervals)
  reached = start
  for s, e in sorted(intervals):
    if s > reached:
      break
    reached = max(reached, e)
  size = stop - start
  if reached < stop or start % size or global_shape[0] % size:
    raise ConfigError(f"config field 'mesh': this process holds rows {sorted(intervals)} of the "
                      "batch, not one aligned block; reorder the mesh axes")
  return start // size, global_shape[0] // size


def global_batch(local: dict[str, np.ndarray], sharding: NamedSharding,
                 batch_size: int) -> dict[str, jax.Array]:
  """Assembles each process's rows into global arrays of ``batch_size`` rows."""
  return {k: jax.make_array_from_process_local_data(sharding, v, (batch_size,) + v.shape[1:])
          for k, v in local.items()}


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())
