"""The mesh axis that splits a row's tokens, as the code being traced sees it.

Model code names no mesh axis: the logical axis ``length`` maps to one through the axis rules in
force (``nn.logical_axis_rules``; ``mesh.axis_rules``, ``context`` by default), on the mesh in
force (``jax.set_mesh``). The hand-written context-parallel paths (the ring, the load-balancing
reorder) run only where that axis exists and has more than one device; elsewhere (one device,
no mesh, decoding) they step aside and the plain path computes the same thing.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
from jax.sharding import PartitionSpec


@dataclasses.dataclass(frozen=True)
class ContextAxis:
  name: str  # the mesh axis ``length`` maps to
  size: int  # devices a row's tokens are split over


def spec(logical_names: tuple[str | None, ...]) -> PartitionSpec:
  """The PartitionSpec of an array with these logical axis names under the rules in force."""
  return nn.logical_to_mesh_axes(logical_names)


def current() -> ContextAxis | None:
  """The token-splitting axis of the mesh in force, or None if it splits nothing."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return None
  axes = spec(("length",))[0]
  if isinstance(axes, tuple):
    if len(axes) != 1:
      raise ValueError(f"context parallelism: the logical axis 'length' maps to {axes}; the "
                       "ring and its load balancing pass blocks along one mesh axis")
    axes = axes[0]
  if axes is None or mesh.shape[axes] == 1:
    return None
  return ContextAxis(axes, mesh.shape[axes])
