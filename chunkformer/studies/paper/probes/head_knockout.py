"""The ``head_knockout`` entry of ``PROBES``: which key/value heads carry retrieval at which
residue of the target position.

Knocking out KV head h of layer l by mean replacement: at the final position only, the
attention outputs of the query heads that read KV head h (query heads h*G .. h*G + G - 1,
G = query heads per KV head) are replaced, before the output projection, by their mean over a
disjoint calibration set of prompts; nothing else changes. Accuracy change relative to the
clean run, by residue of the target key, for every (layer, head): the knockout map
(layers x heads) x residue.

No model code changes: a Flax method interceptor (``nn.intercept_methods``) rewrites the input
of each attention layer's output projection (the module named ``out``) inside one jitted
forward pass, which takes the means and the knockout mask as arguments, so every knockout
reuses one compilation. The calibration means are read the same way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from chunkformer import run_tokens
from chunkformer.config import ConfigError
from chunkformer.data import lookup_task
from chunkformer.evaluation.probes import lookup as lookup_probe
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.probes.base import Figure, ProbeContext, ProbeResult
from chunkformer.evaluation.records import correctness

_LAYER = re.compile(r"block_(\d+)")


def _layer_of(module: nn.Module) -> int | None:
  """The block index of an attention output projection (``block_<l>/attn/out``), else None."""
  path = module.path if hasattr(module, "path") else ()
  if module.name != "out" or len(path) < 2 or path[-2] != "attn":
    return None
  for part in path:
    if (m := _LAYER.fullmatch(str(part))):
      return int(m.group(1))
  return None


class Knockout:
  """A jitted forward pass that records or replaces the final position's per-head attention
  outputs: ``final_heads(rows)`` -> [N, L, H, D]; ``run(rows, means_LxHxD, mask_LxH)`` ->
  (predictions [N, T], final heads [N, L, H, D], final logits [N, V]) with the masked heads of
  each layer replaced at the final position; ``predict`` -> the predictions alone. Rows are
  kv rows mapped into a loaded model's tokens, or its own ids with ``mapped`` False."""

  def __init__(self, trained: trained_lib.TrainedModel, batch_size: int, mapped: bool = True):
    self.trained, self.batch_size = trained, batch_size
    m = trained.config.model
    if m.scan_layers:
      raise ValueError("head_knockout reads unscanned models (model.scan_layers = False)")
    self.layers, self.heads, self.dim = m.num_layers, m.num_heads, m.head_dim
    self.token_map = run_tokens.for_run(trained.workdir, trained.config) if mapped else None
    model = trained.runtime.model

    def forward(params, inputs, positions, segment_ids, means_LxHxD, mask_LxH):
      captured = {}

      def intercept(next_fun, args, kwargs, context):
        layer = _layer_of(context.module) if context.method_name == "__call__" else None
        if layer is None:
          return next_fun(*args, **kwargs)
        o_BxTxHxD = args[0]
        captured[layer] = o_BxTxHxD[:, -1].astype(jnp.float32)
        last = jnp.where(mask_LxH[layer][None, :, None],
                         means_LxHxD[layer][None].astype(o_BxTxHxD.dtype), o_BxTxHxD[:, -1])
        return next_fun(o_BxTxHxD.at[:, -1].set(last), *args[1:], **kwargs)

      with nn.intercept_methods(intercept):
        logits = model.apply({"params": params}, inputs, positions, segment_ids, train=False)
      heads = jnp.stack([captured[layer] for layer in sorted(captured)], axis=1)
      return jnp.argmax(logits, axis=-1).astype(jnp.int32), heads, logits[:, -1]

    self._forward = jax.jit(forward)

  def run(self, rows, means_LxHxD, mask_LxH):
    rt = self.trained.runtime
    inputs = rows["inputs"]
    if self.token_map is not None:
      inputs = self.token_map.to_model[inputs]
    n = inputs.shape[0]
    pieces = []
    with rt.context():
      for start in range(0, n, self.batch_size):
        index = np.minimum(np.arange(start, start + self.batch_size), n - 1)
        batch = [jax.device_put(np.asarray(x[index], np.int32), rt.batch_sharding)
                 for x in (inputs, rows["positions"], rows["segment_ids"])]
        out = jax.device_get(self._forward(self.trained.params, *batch,
                                           jnp.asarray(means_LxHxD), jnp.asarray(mask_LxH)))
        keep = min(self.batch_size, n - start)
        pieces.append([np.asarray(x)[:keep] for x in out])
    preds, heads, logits = (np.concatenate(x) for x in zip(*pieces, strict=True))
    if self.token_map is not None:
      preds = self.token_map.to_kv[preds]
    return preds, heads, logits

  def nothing(self) -> tuple[np.ndarray, np.ndarray]:
    """(means, mask) that knock out no head."""
    return (np.zeros((self.layers, self.heads, self.dim), np.float32),
            np.zeros((self.layers, self.heads), bool))

  def final_heads(self, rows) -> np.ndarray:
    """[N, L, H, D]: every query head's attention output at the final position (clean)."""
    return self.run(rows, *self.nothing())[1]

  def predict(self, rows, means_LxHxD: np.ndarray | None = None,
              mask_LxH: np.ndarray | None = None) -> np.ndarray:
    if means_LxHxD is None:
      means_LxHxD, mask_LxH = self.nothing()
    return self.run(rows, means_LxHxD, mask_LxH)[0]


def query_heads(kv_head: int, num_heads: int, num_kv_heads: int) -> list[int]:
  """The query heads that read ``kv_head`` (query head q reads KV head q // G)."""
  group = num_heads // num_kv_heads
  return list(range(kv_head * group, (kv_head + 1) * group))


def knockout_map(knockout: Knockout, prompts: lookup_task.Prompts,
                 calibration: lookup_task.Prompts, kv_heads: int,
                 sites: Sequence[tuple[int, int]] | None = None) -> dict[str, Any]:
  """Clean outcomes and, per (layer, kv head) in ``sites`` (default: all), the outcomes with
  that head knocked out by its calibration mean. Outcomes are bool [N] in prompt order."""
  means = knockout.final_heads(calibration.rows()).mean(axis=0)  # [L, H, D]
  rows = prompts.rows()
  clean = prompts.correct(knockout.predict(rows))
  out = {"clean": clean, "knocked": {}}
  sites = sites or [(layer, h) for layer in range(knockout.layers) for h in range(kv_heads)]
  for layer, h in sites:
    mask = np.zeros((knockout.layers, knockout.heads), bool)
    mask[layer, query_heads(h, knockout.heads, kv_heads)] = True
    out["knocked"][(layer, h)] = prompts.correct(knockout.predict(rows, means, mask))
  return out


def _by_residue(outcomes, prompts):
  m = prompts.modulus
  return outcomes.astype(np.float64).reshape(m, -1).mean(axis=1)


def probe(context: ProbeContext, modulus: int = 8, prompts_per_residue: int = 0,
          num_records: int = 0, num_demos: int = 8, padding: str = "prefix", seed: int = 31,
          calibration_seed: int = 32, batch_size: int = 32,
          keys: Sequence[int] | None = None, values: Sequence[int] | None = None,
          filler: int | None = None, bos: int | str | None = lookup_probe.DEFAULT,
          vocabulary: str = lookup_probe.TASK, word_seed: int = 0, num_keys: int = 0,
          num_values: int = 0) -> ProbeResult:
  """The ``head_knockout`` entry of ``PROBES``: the knockout map on the lookup task (one
  padding mode, residues mod ``modulus``); the calibration prompts are drawn with
  ``calibration_seed`` (disjoint draws from the evaluation prompts' ``seed``). Records the
  clean accuracy by residue and, per (layer, kv head), the knocked-out accuracy and its change;
  matrices ``head_knockout_clean`` and ``head_knockout_L<l>H<h>`` (prompts x residue)."""
  if seed == calibration_seed:
    raise ConfigError("config field 'sweep.probes.head_knockout.calibration_seed'"
                                   ": must differ from seed (a disjoint calibration set)")
  spec = lookup_probe.lookup_spec(context, "head_knockout", modulus=modulus,
                                  prompts_per_residue=prompts_per_residue,
                                  num_records=num_records, num_demos=num_demos,
                                  padding=padding, keys=keys, values=values, filler=filler,
                                  bos=bos, vocabulary=vocabulary, word_seed=word_seed,
                                  num_keys=num_keys, num_values=num_values)
  prompts = lookup_task.generate(spec, seed)
  calibration = lookup_task.generate(spec, calibration_seed)
  model = context.trained.config.model
  knockout = Knockout(context.trained, batch_size, mapped=vocabulary == lookup_probe.TASK)
  found = knockout_map(knockout, prompts, calibration,
                       model.num_kv_heads)
  clean = _by_residue(found["clean"], prompts)
  heads, matrices = [], {}
  matrices["clean"] = correctness.Matrix(
      found["clean"].astype(np.float64).reshape(modulus, -1).T, np.arange(modulus))
  for (layer, h), right in found["knocked"].items():
    acc = _by_residue(right, prompts)
    heads.append({"layer": layer, "kv_head": h, "accuracy": acc.tolist(),
                  "change": (acc - clean).tolist()})
    matrices[f"L{layer}H{h}"] = correctness.Matrix(
        right.astype(np.float64).reshape(modulus, -1).T, np.arange(modulus))
  figure = Figure(f"{context.unit}: KV-head knockout map (accuracy change by residue)",
                  "knockout_map", (heads,), {"title": f"{context.unit}: knockouts, mod {modulus}"},
                  f"{context.unit}_head_knockout.png")
  return ProbeResult({"modulus": modulus, "padding": padding,
                      "prompts_per_residue": spec.prompts_per_residue,
                      "clean": clean.tolist(), "heads": heads}, matrices,
                     figures=[figure] if heads else [])
