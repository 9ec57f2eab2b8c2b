"""How the decoder stacks its blocks: rematerialisation policies and the scan over layers.

``model.remat`` wraps every block in ``jax.checkpoint`` (``nn.remat``) with a named policy:

- ``none``: no rematerialisation (every activation the backward pass needs is kept);
- ``full``: keep only each block's inputs, recompute the block in the backward pass;
- ``dots``: keep every matmul output (``checkpoint_dots``), recompute the elementwise rest;
- ``dots_no_batch``: keep only matmul outputs without batch dimensions in the contraction
  (``dots_with_no_batch_dims_saveable``: projections and MLP, not attention scores).

``model.scan_layers`` runs the layers as ``nn.scan`` over the repeating unit of
``model.layer_pattern`` (one block, or e.g. one CSA + one HCA block), so the compiled program
holds one unit whatever the depth. One traced unit serves every repetition, so every
repetition must behave like the first scanned one; the first repetition runs unrolled when it
owns state that later layers read through ``shared`` (the dynamic kind's boundary owners), and
``shared`` is the scan's carry together with the residual stream. Parameters of the scanned
layers are stacked under ``layers/block_<j>`` with a leading axis of repetitions (logical name
``layers``, replicated); ``stack_params``/``unstack_params`` convert between the layouts, so a
plain checkpoint can be loaded into a scanned model and back.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from chunkformer.config import ModelConfig

SCAN_NAME = "layers"  # parameter subtree of the scanned repetitions
SCAN_AXIS_NAME = "layers"  # logical name of the stacked axis (no rule: replicated)

REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}

# Collections a block may write; scanned repetitions stack them along axis 0.
SCANNED_COLLECTIONS = ("params", "aux_loss", "aux_metrics", "intermediates")


@dataclasses.dataclass(frozen=True)
class Stack:
  """Layers 0..unrolled-1 run one by one; then ``repeats`` scanned units of ``period`` layers."""

  unrolled: int
  period: int
  repeats: int

  def scanned_layer(self, repeat: int, j: int) -> int:
    return self.unrolled + repeat * self.period + j


def plan(model: ModelConfig) -> Stack:
  """The layout of ``model``'s layers (all unrolled unless ``model.scan_layers``)."""
  if not model.scan_layers:
    return Stack(unrolled=model.num_layers, period=model.pattern_period, repeats=0)
  period = model.pattern_period
  # With boundary_group = 0 (checked in config) every boundary owner lies in the first unit.
  head = period if any(a.kind == "dynamic" for a in model.layers) else 0
  return Stack(unrolled=head, period=period, repeats=(model.num_layers - head) // period)


def stack_params(params: dict[str, Any], model: ModelConfig) -> dict[str, Any]:
  """Plain params (``block_<l>`` per layer) -> the scanned layout of ``plan(model)``.

  Takes unboxed arrays (as in a TrainState); the same map converts AdamW's mu/nu trees.
  """
  s = plan(model)
  out = {k: v for k, v in params.items()
         if not (k.startswith("block_") and int(k.split("_")[1]) >= s.unrolled)}
  if s.repeats:
    out[SCAN_NAME] = {
        f"block_{j}": jax.tree.map(
            lambda *xs: jnp.stack(xs),
            *[params[f"block_{s.scanned_layer(r, j)}"] for r in range(s.repeats)])
        for j in range(s.period)}
  return out


def unstack_params(params: dict[str, Any], model: ModelConfig) -> dict[str, Any]:
  """The scanned layout of ``plan(model)`` -> plain params (``block_<l>`` per layer)."""
  s = plan(model)
  out = {k: v for k, v in params.items() if k != SCAN_NAME}
  for r in range(s.repeats):
    for j in range(s.period):
      out[f"block_{s.scanned_layer(r, j)}"] = jax.tree.map(
          lambda x, r=r: x[r], params[SCAN_NAME][f"block_{j}"])
  return out
