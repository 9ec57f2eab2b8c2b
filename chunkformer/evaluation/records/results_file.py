"""results.json of a sweep, typed: the header, one ``VariantRecord`` per variant, the claims.

Schema versions: 1 (the first sweeps) has no ``schema_version``, ``claims`` or per-variant
``analysis_seed``; 2 adds them; 3 adds per variant ``probes`` (the results of the registry
probes the sweep enabled, each under its name; absent when none was). ``from_json`` reads all
three (a version-1 file has no claims: ``claims`` is empty, recompute them with
``claims.judge``); ``to_json`` writes version 3. A sweep judged under older claim rules than
the current ones (``settings.rules``, ``claims.rules``) also stores every claim under the
current rules (``current_rules``: the version and the claims); absent otherwise.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from chunkformer import workdir as workdir_lib
from chunkformer.evaluation.records import reading
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.variant import VariantRecord

SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)


@dataclasses.dataclass(frozen=True)
class SweepResults:
  sweep: str
  command: str
  date: str
  seed: int
  wall_time_s: float
  settings: Mapping[str, Any]  # the sweep's settings (sweep_config.Settings as a dict)
  num_offsets: int
  window_align: int
  chunk_sizes_in_play: tuple[int, ...]
  verdicts: tuple[str, ...]
  report: str
  variants: tuple[VariantRecord, ...]
  claims: tuple[Claim, ...] = ()
  current_rules: str = ""  # the current claim-rules version when ``current_claims`` are set
  current_claims: tuple[Claim, ...] = ()  # every claim under the current rules (or none)

  def to_json(self) -> dict[str, Any]:
    out = {
        "schema_version": SCHEMA_VERSION, "sweep": self.sweep, "command": self.command,
        "date": self.date, "seed": self.seed, "wall_time_s": self.wall_time_s,
        "settings": _plain(self.settings), "num_offsets": self.num_offsets,
        "window_align": self.window_align, "chunk_sizes_in_play": list(self.chunk_sizes_in_play),
        "verdicts": list(self.verdicts), "claims": [c.to_json() for c in self.claims],
        "report": self.report, "variants": [v.to_json() for v in self.variants]}
    if self.current_claims:
      out["current_rules"] = {"version": self.current_rules,
                              "claims": [c.to_json() for c in self.current_claims]}
    return out

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> SweepResults:
    version = data.get("schema_version", 1)
    if version not in READABLE_VERSIONS:
      raise ValueError(f"results.json schema_version {version!r}: this code reads "
                       f"{', '.join(map(str, READABLE_VERSIONS))}; use the code that wrote it")
    return cls(
        sweep=str(data["sweep"]), command=str(data["command"]), date=str(data["date"]),
        seed=int(data["seed"]), wall_time_s=float(data["wall_time_s"]),
        settings=dict(data["settings"]), num_offsets=int(data["num_offsets"]),
        window_align=int(data["window_align"]),
        chunk_sizes_in_play=tuple(int(m) for m in data["chunk_sizes_in_play"]),
        verdicts=tuple(data["verdicts"]), report=str(data["report"]),
        variants=tuple(VariantRecord.from_json(v) for v in data["variants"]),
        claims=tuple(Claim.from_json(c) for c in data.get("claims", ())),
        current_rules=str((data.get("current_rules") or {}).get("version", "")),
        current_claims=tuple(Claim.from_json(c) for c in
                             (data.get("current_rules") or {}).get("claims", ())))


def _plain(value: Any) -> Any:
  """Settings as JSON (tuples become lists)."""
  if isinstance(value, Mapping):
    return {str(k): _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  return value


WHAT = "a sweep's results.json"
REQUIRED = ("sweep", "command", "date", "settings", "verdicts", "variants")


def load(path: str) -> SweepResults:
  """Reads a results.json (any readable schema version); ``reading.UnreadableFile`` names the
  file for a truncated or foreign one."""
  data = reading.json_object(path, WHAT, REQUIRED)
  return reading.parsed(path, WHAT, lambda: SweepResults.from_json(data))


def dumps(results: SweepResults) -> str:
  return json.dumps(results.to_json(), indent=1, sort_keys=False) + "\n"


def write(path: str, results: SweepResults) -> str:
  """Writes ``results`` atomically (a reader never sees a half-written file)."""
  return workdir_lib.write_text(path, dumps(results))
