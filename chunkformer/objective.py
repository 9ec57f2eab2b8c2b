"""Loss and metrics of one batch.

A batch is a dict of [B, T] arrays (see chunkformer/data/__init__.py):
``inputs``, ``targets`` (int32), ``positions``, ``segment_ids`` (int32), ``loss_mask``
(float32, 1 on tokens that are scored) and, for retrieval tasks, ``near_mask``/``far_mask``
(float32, 1 on answer tokens whose needle lies within / beyond ``data.near_distance``) and, for
corpus batches, ``target_bytes`` (float32, UTF-8 bytes of each scored target), which gives
``bits_per_byte``: the scored loss in bits over the bytes it predicted, comparable across
tokenizers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from chunkformer import loss_tiles
from chunkformer.model import head_weights

Array = jax.Array

# Collections the attention kinds may sow into (see attention/common.py).
AUX_COLLECTIONS = ("aux_loss", "aux_metrics")


def _sum_sown(tree) -> Array:
  leaves = jax.tree_util.tree_leaves(tree)
  return sum((jnp.sum(jnp.asarray(x)) for x in leaves), jnp.zeros((), jnp.float32))


def forward(model: nn.Module, params, batch: Mapping[str, Array], *, train: bool,
            rng: Array | None = None) -> tuple[Array, dict]:
  """Returns logits_BxTxV and the sown auxiliary collections."""
  rngs = {"phase": rng} if rng is not None else {}
  logits, aux = model.apply(
      {"params": params}, batch["inputs"], batch["positions"], batch["segment_ids"],
      train=train, rngs=rngs, mutable=AUX_COLLECTIONS)
  return logits, aux


def forward_tiled(model: nn.Module, params, batch: Mapping[str, Array], tile: int, *,
                  train: bool, rng: Array | None = None) -> tuple[Array, Array, dict]:
  """(ce_BxT, correct_BxT, sown collections) through the tiled loss: no B x T x V logits."""
  rngs = {"phase": rng} if rng is not None else {}
  x_BxTxE, aux = model.apply(
      {"params": params}, batch["inputs"], batch["positions"], batch["segment_ids"],
      train=train, hidden=True, rngs=rngs, mutable=AUX_COLLECTIONS)
  w_VxE, scale, rounding = head_weights(model.model, params)
  ce, correct = loss_tiles.cross_entropy(x_BxTxE, w_VxE, batch["targets"], tile=tile,
                                         scale=scale, rounding=rounding)
  return ce, correct, aux


def metric_sums(logits_BxTxV: Array, batch: Mapping[str, Array]) -> dict[str, Array]:
  """Additive statistics (sums and counts), so that batches and hosts aggregate exactly."""
  targets = batch["targets"]
  ce = optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, targets)
  correct = (jnp.argmax(logits_BxTxV, axis=-1) == targets).astype(jnp.float32)
  return token_sums(ce, correct, batch)


def token_sums(ce_BxT: Array, correct_BxT: Array,
               batch: Mapping[str, Array]) -> dict[str, Array]:
  """``metric_sums`` from per-token cross-entropy and correctness (1.0 / 0.0)."""
  ce, correct = ce_BxT, correct_BxT
  mask = batch["loss_mask"]
  sums = {"loss_sum": jnp.sum(ce * mask), "count": jnp.sum(mask),
          "correct": jnp.sum(correct * mask)}
  if "target_bytes" in batch:
    sums["bytes"] = jnp.sum(batch["target_bytes"] * mask)
  for group in ("near", "far"):
    key = f"{group}_mask"
    if key in batch:
      sums[f"{group}_correct"] = jnp.sum(correct * batch[key])
      sums[f"{group}_count"] = jnp.sum(batch[key])
  return sums


def summarize(sums: Mapping[str, Array]) -> dict[str, float]:
  """Means from additive statistics: loss, accuracy, near/far accuracy, bits_per_byte."""
  def ratio(num, den):
    return float(num) / max(float(den), 1.0)

  out = {"loss": ratio(sums["loss_sum"], sums["count"]),
         "accuracy": ratio(sums["correct"], sums["count"])}
  if "bytes" in sums:
    out["bits_per_byte"] = ratio(sums["loss_sum"], sums["bytes"]) / math.log(2.0)
  for group in ("near", "far"):
    if f"{group}_count" in sums:
      out[f"{group}_accuracy"] = ratio(sums[f"{group}_correct"], sums[f"{group}_count"])
  # aux/ values are per-batch means: summed over batches (or steps), divide by their count.
  batches = max(float(sums.get("aux_batches", 1.0)), 1.0)
  for key, value in sums.items():
    if key.startswith("aux/"):
      out[key] = float(value) / batches
  return out


def loss_fn(params, model: nn.Module, batch: Mapping[str, Array], rng: Array | None,
            train: bool = True, count: Array | None = None,
            aux_weight: float = 1.0) -> tuple[Array, dict[str, Array]]:
  """Mean cross-entropy over scored tokens plus sown auxiliary losses; metric sums as aux.

  The cross-entropy runs over token tiles (loss_tiles.py) when ``model.loss_token_tile`` says
  so for this batch's length; the sums are the same either way.

  ``count`` (default: this batch's scored tokens) divides the summed cross-entropy and
  ``aux_weight`` scales the sown losses: a micro-batch of gradient accumulation passes the
  whole batch's count and 1/k, so that the micro-batches' losses add up to the batch's.
  """
  m = model.model
  tile = loss_tiles.token_tile(m.loss_token_tile, m.vocab_size, batch["targets"].shape[1])
  if tile:
    ce, correct, aux = forward_tiled(model, params, batch, tile, train=train, rng=rng)
    sums = token_sums(ce, correct, batch)
  else:
    logits, aux = forward(model, params, batch, train=train, rng=rng)
    sums = metric_sums(logits, batch)
  aux_loss = _sum_sown(aux.get("aux_loss", {}))
  count = sums["count"] if count is None else count
  loss = sums["loss_sum"] / jnp.maximum(count, 1.0) + aux_weight * aux_loss
  sums["aux/loss"] = aux_loss
  sums["aux_batches"] = jnp.ones((), jnp.float32)
  for path, value in jax.tree_util.tree_leaves_with_path(aux.get("aux_metrics", {})):
    name = "/".join(str(getattr(p, "key", p)) for p in path)
    sums[f"aux/{name}"] = jnp.mean(jnp.asarray(value))
  return loss, sums
