"""Slot gains judged against a null (C6): initialisation and permutation of slots, over seeds.

Input: one compressor site's pooling weights per kv head, [K heads, S' slots] (rows sum to
one; ``slot_gain.analyze``'s ``realised_weight``, or ``bias_weight`` where no realised view
exists), per training seed [N, K, S'], and optionally the same site at initialisation (the
same statistic of the untrained model of each seed). Head h's preferred phase is
``preferred_phase`` (weight centre of mass, in slots); c = (S' - 1) / 2 is the centre.

Statistics of a site:
- ``shift``: mean over heads of (preferred phase - c); < 0 all heads lean early, > 0 late;
- ``spread``: max - min over heads of the preferred phase (heads specialise early vs late);
- ``deviation``: mean over heads of the total variation distance from the uniform weights
  (how far the gains are from 1 at all; invariant to the order of slots).

Nulls, both the same statistic:
- initialisation: the statistic of the initialised model; per seed, trained minus init (the
  ``excess``) with a Student-t interval over seeds;
- permutation of slots: each head's weights shuffled over its slots by an independent random
  permutation (the slot *order* carries no information; the weights' magnitudes stay). P-value
  ``(1 + #{null >= observed}) / (1 + R)`` of |shift| and of spread, per seed and seed-pooled
  (the mean over seeds against the mean of independent per-seed permutations). ``deviation``
  does not change under permutation, so only initialisation judges it. Per head: a two-sided
  permutation p-value of |preferred phase - c|; with S' slots it cannot fall below 2 / S'!
  (0.083 at S' = 4), so one head is never significant at 0.05 with 4 slots: judge the site.

Heads are not matched across seeds (their order is arbitrary), so across seeds only the
site-level statistics are compared. A seed *holds* (the site shows a learned slot preference)
when the permutation p-value is < alpha and, with init weights given, the statistic exceeds
its value at initialisation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chunkformer.evaluation.stats.estimates import _PERMUTATION_STREAM, _fail, _rng
from chunkformer.evaluation.stats.seed_rule import seed_agreement, seed_interval

PERMUTED = ("shift", "spread")
STATISTICS = ("shift", "spread", "deviation")


def preferred_phase(weights_KxS: np.ndarray) -> np.ndarray:
  """Weight centre of mass of each head's slot distribution, in slots, [K]."""
  w = np.asarray(weights_KxS, np.float64)
  slots = np.arange(w.shape[-1])
  total = w.sum(axis=-1)
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(total > 0, (w * slots).sum(axis=-1) / total, np.nan)


def _as_weights_NxKxS(weights, name: str) -> np.ndarray:
  w = np.asarray(weights, np.float64)
  if w.ndim == 2:
    w = w[None]
  if w.ndim != 3 or min(w.shape) < 1 or w.shape[2] < 2:
    _fail(name, f"expected [K, S'] or [N, K, S'] with S' >= 2 slots, got {np.shape(weights)}")
  if not np.all(np.isfinite(w)) or w.min() < 0 or np.any(w.sum(axis=-1) <= 0):
    _fail(name, "weights must be finite, non-negative, with a positive sum per head")
  return w / w.sum(axis=-1, keepdims=True)


def _statistics(w_XxKxS: np.ndarray) -> dict[str, np.ndarray]:
  """shift, spread and deviation of any leading batch of [K, S'] weight sets."""
  slots = w_XxKxS.shape[-1]
  phase = preferred_phase(w_XxKxS) - (slots - 1) / 2.0
  return {"shift": phase.mean(axis=-1), "spread": np.ptp(phase, axis=-1),
          "deviation": 0.5 * np.abs(w_XxKxS - 1.0 / slots).sum(axis=-1).mean(axis=-1)}


def _permuted(w_NxKxS: np.ndarray, num_permutations: int,
              rng: np.random.Generator) -> np.ndarray:
  """[R, N, K, S']: every head's slots shuffled by its own permutation in every draw."""
  if num_permutations < 1:
    _fail("num_permutations", f"must be >= 1, got {num_permutations}")
  slots = w_NxKxS.shape[-1]
  perms = rng.permuted(np.broadcast_to(np.arange(slots), (num_permutations,) + w_NxKxS.shape),
                       axis=-1)
  return np.take_along_axis(np.broadcast_to(w_NxKxS, perms.shape), perms, axis=-1)


def _p_value(null_R: np.ndarray, observed: float) -> float:
  tolerance = 1e-9 * max(float(np.abs(null_R).max(initial=0.0)), abs(observed)) + 1e-12
  return float((1 + np.sum(null_R >= observed - tolerance)) / (1 + null_R.size))


def _summary(values_N: np.ndarray, confidence: float) -> dict[str, Any]:
  est = seed_interval(values_N, confidence)
  return {"per_seed": [float(v) for v in values_N], "mean": est.mean, "low": est.low,
          "high": est.high}


def site_weights(analyses: Sequence[Mapping[str, Any]],
                 key: str = "realised_weight") -> dict[str, np.ndarray]:
  """Per compressor site, the [N, K, S'] stack over seeds of ``key`` (``bias_weight`` too).

  ``analyses`` holds one ``slot_gain.analyze`` result per seed (or the init model of each
  seed, in the same order). Sites lacking ``key`` in some seed are left out.
  """
  found: dict[str, list] = {}
  for analysis in analyses:
    for site in analysis.get("sites", []):
      if site.get(key) is not None:
        found.setdefault(site["site"], []).append(np.asarray(site[key], np.float64))
  return {name: np.stack(rows) for name, rows in found.items() if len(rows) == len(analyses)}


def slot_gain_null(trained, init=None, *, num_permutations: int = 2000, alpha: float = 0.05,
                   min_agree: int = 2, confidence: float = 0.95, seed: int = 0) -> dict[str, Any]:
  """Every C6 number of one compressor site (module docstring).

  Args:
    trained: pooling weights per head, [K, S'] or [N seeds, K, S'] (normalised per head here).
    init: the same site at initialisation, same shape, or None (permutation null only).
    seed: seeds the permutations.
  Returns:
    JSON-ready: ``slots``, ``num_seeds``, ``preferred_phase`` ([N][K]), ``head_p_values``
    ([N][K]); per statistic (``shift``, ``spread``, ``deviation``): ``per_seed`` values,
    ``mean``/``low``/``high`` over seeds, ``init`` and ``excess`` (trained - init) summaries
    when init is given, and for shift and spread ``p_values`` per seed, ``pooled_p_value``,
    ``holds`` per seed and ``agreement`` (``seed_rule.SeedAgreement.record``).
  """
  w = _as_weights_NxKxS(trained, "trained")
  w0 = None if init is None else _as_weights_NxKxS(init, "init")
  if w0 is not None and w0.shape != w.shape:
    _fail("init", f"expected the trained shape {w.shape}, got {w0.shape}")
  num_seeds, _, slots = w.shape
  rng = _rng(seed, _PERMUTATION_STREAM)
  observed = _statistics(w)
  null = _statistics(_permuted(w, num_permutations, rng))  # [R, N] each
  initial = None if w0 is None else _statistics(w0)
  centre = (slots - 1) / 2.0
  phase_NxK = preferred_phase(w) - centre
  head_null_RxNxK = np.abs(preferred_phase(_permuted(w, num_permutations, rng)) - centre)
  head_p = [[_p_value(head_null_RxNxK[:, n, k], abs(phase_NxK[n, k]))
             for k in range(phase_NxK.shape[1])] for n in range(num_seeds)]
  record: dict[str, Any] = {
      "slots": int(slots), "num_seeds": int(num_seeds), "alpha": float(alpha),
      "num_permutations": int(num_permutations),
      "preferred_phase": (phase_NxK + centre).tolist(), "head_p_values": head_p,
  }
  for name in STATISTICS:
    value_N = observed[name]
    entry = _summary(value_N, confidence)
    if initial is not None:
      entry["init"] = _summary(initial[name], confidence)
      entry["excess"] = _summary(value_N - initial[name], confidence)
    if name in PERMUTED:
      sided = np.abs if name == "shift" else (lambda x: x)
      p_N = [_p_value(sided(null[name][:, n]), float(sided(value_N[n])))
             for n in range(num_seeds)]
      pooled_p = _p_value(sided(null[name].mean(axis=1)), float(sided(value_N.mean())))
      above_init = (np.ones(num_seeds, bool) if initial is None
                    else sided(value_N) > sided(initial[name]))
      holds = [bool(p < alpha and a) for p, a in zip(p_N, above_init, strict=True)]
      pooled_holds = pooled_p < alpha and bool(
          initial is None or sided(value_N.mean()) > sided(initial[name].mean()))
      entry.update({"p_values": p_N, "pooled_p_value": pooled_p, "holds": holds,
                    "agreement": seed_agreement(holds, pooled_holds,
                                                min_agree=min_agree).record()})
    record[name] = entry
  return record
