"""What the lookup is worth to a model that never reads the target key's record.

A lookup prompt (``lookup_task``) shows R records, D demonstrations of other records and the
target key; the target is never demonstrated. A model can then score without retrieving: it
answers with a value it picks by a rule that ignores which record the target key names. With
14 demonstrations of 16 records (plan version 5) the target is one of the 2 undemonstrated
records, and picking either one's value scores about 51.7%; a unit at that accuracy has shown
no retrieval at all.

``baselines`` gives each such strategy's expected accuracy on every prompt (exact, no sampling:
a uniform pick among k candidates is right with probability (candidates with the answer's
value) / k) and the best of them per residue, so a probe records, beside a model's accuracy,
the accuracy it must beat. The strategies:
- ``undemonstrated``: the value of a random record whose key was not demonstrated
  (elimination; the target is always among them);
- ``undemonstrated_mode``: the most frequent value among those records (ties: a random one);
- ``record_mode``: the most frequent value among all records;
- ``last_record`` / ``last_undemonstrated``: the value of the last record (of the last
  undemonstrated one) before the demonstrations;
- ``demonstrated``: the value of a random demonstration;
- ``any_value``: a random value token (chance).
Each reads the record region only through values and demonstrated keys; none compares a key
with the target's. A strategy that picks a record by the target's position is not among them:
it reads the record at that position, which is the target's record whenever it is right.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from chunkformer.data import lookup_task

STRATEGIES = ("undemonstrated", "undemonstrated_mode", "record_mode", "last_record",
              "last_undemonstrated", "demonstrated", "any_value")


@dataclasses.dataclass(frozen=True)
class Shortcuts:
  """Every strategy's expected accuracy per prompt and per residue, and the best."""

  per_prompt: Mapping[str, np.ndarray]  # strategy -> float [N]: P(right) on each prompt
  residues: np.ndarray  # int64 [N]
  modulus: int

  def by_residue(self, strategy: str) -> np.ndarray:
    """float [modulus]: the strategy's mean accuracy over each residue's prompts."""
    p = self.per_prompt[strategy]
    return np.array([p[self.residues == r].mean() for r in range(self.modulus)])

  def mean(self, strategy: str) -> float:
    return float(np.mean(self.per_prompt[strategy]))

  @property
  def best(self) -> str:
    """The strategy with the highest mean accuracy (ties: the first of ``STRATEGIES``)."""
    return max(STRATEGIES, key=lambda s: (self.mean(s), -STRATEGIES.index(s)))

  @property
  def best_per_prompt(self) -> np.ndarray:
    """float [N]: the best strategy's P(right) on each prompt (the retrieval gate's null)."""
    return np.asarray(self.per_prompt[self.best], np.float64)

  def record(self) -> dict:
    """JSON-ready: the best strategy, its mean and per-residue accuracy, every mean."""
    return {"best": self.best, "mean": self.mean(self.best),
            "by_residue": [float(x) for x in self.by_residue(self.best)],
            "means": {s: self.mean(s) for s in STRATEGIES}}


def _uniform_pick(candidates: np.ndarray, answer: int) -> float:
  return float(np.mean(candidates == answer)) if candidates.size else 0.0


def _mode_pick(candidates: np.ndarray, answer: int) -> float:
  if not candidates.size:
    return 0.0
  found, counts = np.unique(candidates, return_counts=True)
  modes = found[counts == counts.max()]
  return float(answer in modes) / modes.size


def baselines(spec: lookup_task.LookupSpec, prompts: lookup_task.Prompts) -> Shortcuts:
  """Each strategy's expected accuracy on every prompt of ``prompts`` (made from ``spec``)."""
  tokens, records = prompts.tokens, prompts.record_positions
  demo_keys = tokens[:, spec.demo_key_positions]
  demo_values = tokens[:, spec.demo_key_positions + 1]
  record_keys = np.take_along_axis(tokens, records, axis=1)
  record_values = np.take_along_axis(tokens, records + 1, axis=1)
  answers = prompts.answers[:, 0]
  chance = 1.0 / len(set(spec.values))
  out = {s: np.empty(len(answers)) for s in STRATEGIES}
  for i, answer in enumerate(answers):
    undemo = ~np.isin(record_keys[i], demo_keys[i])
    values = record_values[i]
    out["undemonstrated"][i] = _uniform_pick(values[undemo], answer)
    out["undemonstrated_mode"][i] = _mode_pick(values[undemo], answer)
    out["record_mode"][i] = _mode_pick(values, answer)
    out["last_record"][i] = float(values[-1] == answer)
    out["last_undemonstrated"][i] = float(values[undemo][-1] == answer)
    out["demonstrated"][i] = _uniform_pick(demo_values[i], answer)
    out["any_value"][i] = chance
  return Shortcuts(out, np.asarray(prompts.residues), prompts.modulus)
