"""The ``gate_concentration`` entry of ``PROBES``: how many offsets each compressor gate reads.

For every gate (layer, stream k / v / kv, kv head) the realised pooling weights alpha_j of
each complete window j (W offsets, ``pool_weights`` sown by the compressor: one weight per
offset, averaged over channels for a vector gate) on the model's own held-out rows give two
effective numbers of offsets, exp of an entropy (1 = one-hot, W = uniform):
- static = exp(H(E_j[alpha_j])): concentration of the average gate (a gate tied to phases);
- per window = E_j[exp(H(alpha_j))]: concentration inside each window (content-dependent
  choices that may average out to a uniform static gate).
Complete windows are those whose W tokens all lie in the row (fixed chunks, geometry from the
chunk layout); layers of other kinds count windows whose weights are all positive.

With ``trajectory=True`` the same rows are read at every checkpoint the run kept
(``DIR/checkpoints``, oldest first): how the gates concentrate over training.

Scanned models (``model.scan_layers``) are refused: convert their params with
``layer_stack.unstack_params`` first.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from chunkformer import checkpointing, layer_stack
from chunkformer.compression import chunk_offsets, pooling
from chunkformer.config import ConfigError
from chunkformer.evaluation.probes import loaded_model, slot_gain
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.probes.base import Figure, ProbeContext, ProbeResult

POOL_WEIGHTS = "pool_weights"
STREAMS = {"key_compressor": "k", "value_compressor": "v", "compressor": "kv"}
_LAYER = re.compile(r"block_(\d+)")


def entropy(p: np.ndarray, axis: int = -1) -> np.ndarray:
  """Shannon entropy (nats) along ``axis``; 0 log 0 = 0."""
  p = np.asarray(p, np.float64)
  return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=axis)


def concentration(alpha_NxW: np.ndarray) -> tuple[float, float]:
  """(static, per window) effective numbers of offsets of N windows' gate weights."""
  alpha_NxW = np.asarray(alpha_NxW, np.float64)
  return (float(np.exp(entropy(alpha_NxW.mean(axis=0)))),
          float(np.mean(np.exp(entropy(alpha_NxW, axis=1)))))


def _site(path: tuple[str, ...]) -> tuple[int, str] | None:
  """(layer, stream) of a sown pool_weights path, or None for another leaf."""
  if POOL_WEIGHTS not in path:
    return None
  if layer_stack.SCAN_NAME in path:
    raise ConfigError("config field 'model.scan_layers': gate_concentration reads unscanned "
                      "models; convert the params with layer_stack.unstack_params")
  site = path[:path.index(POOL_WEIGHTS)]
  layer = next(int(m.group(1)) for p in site if (m := _LAYER.fullmatch(p)))
  return layer, STREAMS.get(site[-1], site[-1])


def _complete(model, layer: int, w_BxCxWxK: jax.Array, seq_len: int) -> jax.Array:
  """complete_BxCxK: windows whose W tokens all lie in the row."""
  attn = model.layer_attention(layer)
  b, c, w, k = w_BxCxWxK.shape
  if attn.kind not in ("fixed",):
    return jnp.all(w_BxCxWxK > 0, axis=2)
  offsets = chunk_offsets(model, attn, layer, b, None)
  if offsets is None:
    offsets = jnp.zeros((b, k), jnp.int32)
  tok = pooling.fixed_slot_tokens(c, attn.chunk_size, offsets, w)
  return jnp.all((tok >= 0) & (tok < seq_len), axis=2)


def extract(model) -> trained_lib.Extract:
  """Per row (in the jitted forward pass), per gate site ``L<layer>/<stream>``: the summed
  weights of complete windows [B, W, K], summed exp(entropy) [B, K] and the count [B, K]."""
  def run(collections, rows):
    seq_len = rows["inputs"].shape[1]
    out = {}
    for path, value in slot_gain.walk(collections.get(trained_lib.INTERMEDIATES, {})):
      site = _site(path)
      if site is None:
        continue
      layer, stream = site
      for w in value if isinstance(value, (tuple, list)) else (value,):
        w_BxCxWxK = w.astype(jnp.float32)
        keep_BxCxK = _complete(model, layer, w_BxCxWxK, seq_len).astype(jnp.float32)
        logs = jnp.where(w_BxCxWxK > 0, jnp.log(jnp.where(w_BxCxWxK > 0, w_BxCxWxK, 1.0)), 0.0)
        eff_BxCxK = jnp.exp(-jnp.sum(w_BxCxWxK * logs, axis=2))
        name = f"L{layer}/{stream}"
        out[f"gate_sum/{name}"] = jnp.einsum("bcwk,bck->bwk", w_BxCxWxK, keep_BxCxK)
        out[f"gate_eff/{name}"] = jnp.sum(eff_BxCxK * keep_BxCxK, axis=1)
        out[f"gate_count/{name}"] = jnp.sum(keep_BxCxK, axis=1)
    return out
  return run


def summarize(sums: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
  """One entry per gate from ``extract``'s outputs summed over rows."""
  gates = []
  names = sorted({k.split("/", 1)[1] for k in sums if k.startswith("gate_sum/")},
                 key=lambda n: (int(n.split("/")[0][1:]), n))
  for name in names:
    total_WxK, eff_K = sums[f"gate_sum/{name}"], sums[f"gate_eff/{name}"]
    count_K = sums[f"gate_count/{name}"]
    layer, stream = name.split("/")
    for head in range(total_WxK.shape[1]):
      n = float(count_K[head])
      if n == 0:
        continue
      mean_alpha = total_WxK[:, head] / n
      gates.append({"layer": int(layer[1:]), "stream": stream, "head": head,
                    "window": int(total_WxK.shape[0]), "windows": int(n),
                    "static": float(np.exp(entropy(mean_alpha / mean_alpha.sum()))),
                    "per_window": float(eff_K[head] / n),
                    "mean_alpha": [float(a) for a in mean_alpha]})
  return gates


def measure(trained: trained_lib.TrainedModel, rows: Mapping[str, np.ndarray],
            batch_size: int) -> list[dict[str, Any]]:
  """Every gate's concentration on ``rows`` (a loaded model's kv rows are mapped)."""
  predictor = loaded_model.adapt(trained, trained_lib.Predictor(
      trained, batch_size, extract=extract(trained.config.model)))
  out = predictor({k: rows[k] for k in trained_lib.ROW_KEYS})
  return summarize({k: v.sum(axis=0) for k, v in out.items() if k.startswith("gate_")})


def kept_params(trained: trained_lib.TrainedModel) -> Iterator[tuple[int, Any]]:
  """(step, params) of every checkpoint the run kept, oldest first (read only)."""
  if not os.path.isdir(os.path.join(trained.workdir, "checkpoints")):
    raise ConfigError(f"config field 'sweep.probes.gate_concentration.trajectory': workdir "
                      f"{trained.workdir!r} holds no checkpoints")
  checkpointer = checkpointing.Checkpointer(trained.workdir, trained.config.train,
                                            read_only=True)
  try:
    for step in checkpointer.steps():
      state = checkpointer.manager.restore(
          step, args=ocp.args.StandardRestore(trained.runtime.abstract_state))
      yield step, state.params
  finally:
    checkpointer.close()


def probe(context: ProbeContext, rows: int = 16, batch_size: int = 8, seed: int = 7,
          trajectory: bool = False) -> ProbeResult:
  """The ``gate_concentration`` entry of ``PROBES``: every gate's static and per-window
  effective number of offsets on ``rows`` held-out rows of the model's own data (``seed`` picks
  the held-out batches). Records ``{"rows", "step", "gates": [...]}`` (a model without
  compressor gates: an empty list) and, with ``trajectory``, ``"trajectory": [{"step",
  "gates"}, ...]`` over the run's kept checkpoints."""
  trained = context.trained
  data = trained_lib.heldout_rows(trained.config, rows, first_step=seed)
  data = {k: data[k] for k in trained_lib.ROW_KEYS}
  record = {"rows": rows, "step": trained.step, "gates": measure(trained, data, batch_size)}
  if trajectory:
    record["trajectory"] = [
        {"step": step, "gates": measure(dataclasses.replace(trained, params=params, step=step),
                                        data, batch_size)}
        for step, params in kept_params(trained)]
  figures = [Figure(f"{context.unit}: gate concentration (static vs per window)",
                    "concentration_plane", (record["gates"],),
                    {"title": f"{context.unit}: effective offsets per gate"},
                    f"{context.unit}_gate_concentration.png")] if record["gates"] else []
  return ProbeResult(record, figures=figures)
