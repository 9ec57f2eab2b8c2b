"""One run per work directory: its resolved config is recorded, and a different run is refused.

``DIR/config.json`` holds ``chunkformer.config.to_dict`` of the run. Rerunning the same command
resumes. A config that differs in anything that shapes the training trajectory is refused with
the list of differing fields, unless ``overwrite`` is given: then everything in DIR is moved
into ``DIR/replaced-<timestamp>/`` first (never deleted, never mixed). Fields that only change
bookkeeping (``BOOKKEEPING_FIELDS``) may change between reruns; the new values are recorded.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import jax
from absl import logging
from jax.experimental import multihost_utils

from chunkformer import config as config_lib
from chunkformer.config import Config, ConfigError

CONFIG_FILE = "config.json"
FINAL_METRICS_FILE = "final_metrics.json"
REPLACED_PREFIX = "replaced-"

# Changing these does not change parameters or data at any step.
BOOKKEEPING_FIELDS = frozenset({
    "train.log_every", "train.eval_every", "train.eval_batches", "train.checkpoint_every",
    "train.keep_checkpoints", "mesh.data", "mesh.fsdp", "mesh.tensor", "mesh.axis_rules",
    "model.remat",  # recomputes the same values: parameters and checkpoint layout unchanged
})


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
  if isinstance(tree, dict):
    out = {}
    for key, value in tree.items():
      out.update(_flatten(value, f"{prefix}{key}."))
    return out
  return {prefix[:-1]: tree}


def config_json(config: Config) -> dict[str, Any]:
  """The config as plain JSON values (tuples become lists, as when read back)."""
  return json.loads(json.dumps(config_lib.to_dict(config)))


def differences(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
  """field -> (old value, new value) for every field that differs ('<absent>' if missing)."""
  a, b = _flatten(old), _flatten(new)
  return {k: (a.get(k, "<absent>"), b.get(k, "<absent>"))
          for k in sorted(a.keys() | b.keys()) if a.get(k, "<absent>") != b.get(k, "<absent>")}


def recorded_identity(recorded: dict[str, Any]) -> dict[str, Any]:
  """A recorded config.json with every field it lacks filled with today's default.

  A run written before a field existed ran with that field's default behaviour, so a field
  added with a default must not make the run "different". Records that no longer parse (a
  field removed or renamed) are compared as they are, so the differing field is still named.
  """
  try:
    return config_json(config_lib.from_dict(recorded))
  except ConfigError:
    return recorded


def read_config(workdir: str) -> Config:
  """The config recorded in ``workdir``; ConfigError naming the directory if there is none."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    raise ConfigError(f"workdir {workdir!r} holds no run ({CONFIG_FILE} missing)")
  with open(path) as f:
    return config_lib.from_dict(json.load(f))


def prepare(workdir: str, config: Config, overwrite: bool = False) -> None:
  """Claims ``workdir`` for ``config`` (see module docstring). Only process 0 writes."""
  path = os.path.join(workdir, CONFIG_FILE)
  new = config_json(config)
  writer = jax.process_index() == 0
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    diff = differences(recorded_identity(old), new)
    blocking = {k: v for k, v in diff.items() if k not in BOOKKEEPING_FIELDS}
    if blocking and not overwrite:
      lines = "\n".join(f"  {k}: {a!r} -> {b!r}" for k, (a, b) in blocking.items())
      raise ConfigError(
          f"workdir {workdir!r} holds a different run; differing config fields:\n{lines}\n"
          "pass --overwrite to move that run aside, or choose another --workdir")
    if blocking and writer:
      _move_aside(workdir)
    elif diff:
      logging.info("workdir %s: bookkeeping fields changed: %s", workdir, diff)
  if writer:
    os.makedirs(workdir, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
      json.dump(new, f, indent=2, sort_keys=True)
    os.replace(tmp, path)
  if jax.process_count() > 1:  # nobody opens DIR/checkpoints before a move-aside is done
    multihost_utils.sync_global_devices("chunkformer_workdir_prepared")


def _move_aside(workdir: str) -> None:
  target = os.path.join(workdir, REPLACED_PREFIX + time.strftime("%Y%m%d-%H%M%S"))
  suffix = 0
  while os.path.exists(target + (f"-{suffix}" if suffix else "")):
    suffix += 1
  target += f"-{suffix}" if suffix else ""
  os.makedirs(target)
  for name in os.listdir(workdir):
    if not name.startswith(REPLACED_PREFIX):
      os.replace(os.path.join(workdir, name), os.path.join(target, name))
  logging.warning("workdir %s: previous run moved to %s", workdir, target)


def write_json(workdir: str, name: str, payload: dict[str, Any]) -> str:
  """Atomically writes ``payload`` to ``DIR/name`` (process 0 only); returns the path."""
  path = os.path.join(workdir, name)
  if jax.process_index() == 0:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
      json.dump(payload, f, indent=2, sort_keys=True)
    os.replace(tmp, path)
  return path
