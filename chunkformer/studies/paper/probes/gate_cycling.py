"""The ``gate_cycling`` entry of ``PROBES``: move the gates' offset preferences by delta and see
whether the weak phases follow.

For a model whose compressors read windows of W = S tokens with one gate map per offset
(``attn.offset_maps = "per_offset"``, gated pooling), offset i has its own gate parameters
Z_i (``wgate`` kernel, channel group i) and b_i (``ape``, channel group i). Cycling by delta
gives offset (i + delta) mod S the parameters offset i had, in every compressor of every layer,
payload maps (``wkv``) unchanged. If the gates alone decide which phase is weak, the accuracy
curve moves with them: A_delta(r) = A_0((r - delta) mod S).

Accuracy by phase comes from the lookup task (``data/lookup_task.py``, residues mod S, prefix
padding by default). Reported: accuracy by phase for delta = 0 and every cycle; R^2 of the
observed changes A_delta(r) - A_0(r) against the predicted ones A_0((r - delta) mod S) - A_0(r)
over all cycles, leaving out the boundary phase S - 1 both as the phase read and as the phase
a prediction copies (its weakness comes from the window boundary, not from the gate: the token
after it lands in the next entry); and the boundary phase's accuracy under every cycle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from chunkformer.config import ConfigError
from chunkformer.data import lookup_task
from chunkformer.evaluation.probes import loaded_model
from chunkformer.evaluation.probes import lookup as lookup_probe
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.probes.base import Figure, ProbeContext, ProbeResult
from chunkformer.evaluation.records import correctness
from chunkformer.studies.paper.stats import cycling

GATE_PARAMS = ("wgate", "ape")  # Z_i (its kernel) and b_i: channel group i serves offset i
COMPRESSORS = ("compressor", "key_compressor", "value_compressor")

# (params, rows) -> predictions [N, T]
PredictWith = Callable[[Any, dict[str, np.ndarray]], np.ndarray]


def check_cyclable(model) -> int:
  """S of a model whose every compressed layer cycles (W = S, per-offset gated maps);
  ConfigError naming the field otherwise."""
  strides = set()
  for layer in range(model.num_layers):
    a = model.layer_attention(layer)
    if a.kind != "fixed":
      continue
    field = "model.attention"
    if a.window_tokens != a.chunk_size:
      raise ConfigError(f"config field '{field}.compress_window': gate cycling needs W = S, "
                        f"layer {layer} has W = {a.window_tokens}, S = {a.chunk_size}")
    if a.offset_maps != "per_offset" or a.pooling not in ("gated", "gated_no_bias"):
      raise ConfigError(f"config field '{field}.offset_maps': gate cycling needs per-offset "
                        f"gated pooling, layer {layer} has {a.offset_maps!r} maps and "
                        f"{a.pooling!r} pooling")
    strides.add(a.chunk_size)
  if len(strides) != 1:
    raise ConfigError("config field 'model.attention.chunk_size': gate cycling needs fixed "
                      f"compressed layers of one stride, found {sorted(strides) or 'none'}")
  return strides.pop()


def _roll_groups(x: np.ndarray, groups: int, delta: int) -> np.ndarray:
  """Last axis = ``groups`` channel groups: group (i + delta) mod G gets group i's channels."""
  shape = x.shape
  grouped = np.asarray(x).reshape(shape[:-1] + (groups, shape[-1] // groups))
  return np.roll(grouped, delta, axis=-2).reshape(shape)


def cycle_gates(params: Any, delta: int, window: int) -> Any:
  """``params`` with every compressor's gate parameters (``wgate`` kernel, ``ape``) cycled by
  ``delta`` offsets (W = ``window`` channel groups); everything else unchanged."""
  def visit(path, leaf):
    names = [str(getattr(k, "key", k)) for k in path]
    inside = any(n in COMPRESSORS for n in names) and any(n in GATE_PARAMS for n in names)
    if not inside:
      return leaf
    return jax.numpy.asarray(_roll_groups(np.asarray(leaf), window, delta), leaf.dtype)
  return jax.tree_util.tree_map_with_path(visit, nn.meta.unbox(params))


@dataclasses.dataclass(frozen=True)
class Cycling:
  stride: int
  deltas: tuple[int, ...]
  accuracy: dict[int, list[float]]  # delta -> accuracy by phase (0 = the model as trained)
  r_squared: float | None  # observed vs predicted changes, boundary phase left out
  boundary: dict[int, float]  # delta -> accuracy at phase S - 1

  def to_record(self) -> dict[str, Any]:
    return {"stride": self.stride, "deltas": list(self.deltas),
            "accuracy": {str(d): a for d, a in self.accuracy.items()},
            "r_squared": self.r_squared,
            "boundary": {str(d): a for d, a in self.boundary.items()}}


def analyse(accuracy: dict[int, np.ndarray], stride: int) -> Cycling:
  """The statistics of accuracy by phase per delta (``accuracy[0]``: as trained)."""
  boundary = stride - 1
  return Cycling(stride, tuple(d for d in accuracy if d), {
      d: [float(x) for x in a] for d, a in accuracy.items()},
      cycling.cycle_r_squared(accuracy, stride),
      {d: float(a[boundary]) for d, a in accuracy.items()})


def accuracy_by_delta(params: Any, predict_with: PredictWith, prompts: lookup_task.Prompts,
                      deltas: Sequence[int], stride: int) -> tuple[dict[int, np.ndarray],
                                                                   dict[int, np.ndarray]]:
  """(accuracy by phase, outcomes [per phase, phase]) for delta 0 and every cycle."""
  accuracy, outcomes = {}, {}
  for delta in (0, *deltas):
    cycled = params if delta == 0 else cycle_gates(params, delta, stride)
    right = prompts.correct(predict_with(cycled, prompts.rows()))
    outcomes[delta] = right.reshape(stride, -1).T.astype(np.float64)
    accuracy[delta] = outcomes[delta].mean(axis=0)
  return accuracy, outcomes


def _predict_with(trained: trained_lib.TrainedModel, batch_size: int,
                  mapped: bool = True) -> PredictWith:
  """One jitted predictor whose parameters are swapped per call (compiled once); kv rows are
  mapped into a loaded model's tokens unless ``mapped`` is False (rows in its own ids)."""
  base = trained_lib.Predictor(trained, batch_size)
  predictor = loaded_model.adapt(trained, base) if mapped else base

  def run(params, rows):
    base.trained = dataclasses.replace(trained, params=params)
    return predictor(rows)["predictions"]
  return run


def probe(context: ProbeContext, deltas: Sequence[int] = (1, -1, 2, -2, 3, -3),
          prompts_per_residue: int = 0, num_records: int = 0, num_demos: int = 8,
          padding: str = "prefix", seed: int = 4242, batch_size: int = 32,
          keys: Sequence[int] | None = None, values: Sequence[int] | None = None,
          filler: int | None = None, bos: int | str | None = lookup_probe.DEFAULT,
          vocabulary: str = lookup_probe.TASK, word_seed: int = 0, num_keys: int = 0,
          num_values: int = 0) -> ProbeResult:
  """The ``gate_cycling`` entry of ``PROBES`` (W = S models; others record None): lookup
  accuracy by phase after cycling the gates by each of ``deltas``. Matrices
  ``gate_cycling_delta<+d>``: outcomes [prompts per phase, phase]."""
  trained = context.trained
  try:
    stride = check_cyclable(trained.config.model)
  except ConfigError:
    return ProbeResult(None)
  if any(d % stride == 0 for d in deltas):
    raise ConfigError(f"config field 'sweep.probes.gate_cycling.deltas': {list(deltas)} holds "
                      f"a multiple of the stride {stride} (no cycle)")
  spec = lookup_probe.lookup_spec(context, "gate_cycling", modulus=stride,
                                  prompts_per_residue=prompts_per_residue,
                                  num_records=num_records, num_demos=num_demos, padding=padding,
                                  keys=keys, values=values, filler=filler, bos=bos,
                                  vocabulary=vocabulary, word_seed=word_seed,
                                  num_keys=num_keys, num_values=num_values)
  prompts = lookup_task.generate(spec, seed)
  predict_with = _predict_with(trained, batch_size, mapped=vocabulary == lookup_probe.TASK)
  accuracy, outcomes = accuracy_by_delta(trained.params, predict_with, prompts, tuple(deltas),
                                         stride)
  matrices = {f"delta{d:+d}" if d else "delta0": correctness.Matrix(o, np.arange(stride))
              for d, o in outcomes.items()}
  figure = Figure(f"{context.unit}: accuracy by phase after each gate cycle", "cycling",
                  (accuracy,), {"title": f"{context.unit}: gates cycled by delta"},
                  f"{context.unit}_gate_cycling.png")
  return ProbeResult(analyse(accuracy, stride).to_record(), matrices, figures=[figure])
