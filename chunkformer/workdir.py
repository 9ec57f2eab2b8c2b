"""One run per work directory: its resolved config is recorded, and a different run is refused.

``DIR/config.json`` holds ``chunkformer.config.to_dict`` of the run. Rerunning the same command
resumes. A config that differs in anything that shapes the training trajectory is refused with
the list of differing fields, unless ``overwrite`` is given: then everything in DIR is moved
into ``DIR/replaced-<timestamp>/`` first (never deleted, never mixed). Fields that only change
bookkeeping (``BOOKKEEPING_FIELDS``) may change between reruns; the new values are recorded.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import jax
from absl import logging
from jax.experimental import multihost_utils

from chunkformer import config as config_lib
from chunkformer import run_lock
from chunkformer.config import Config, ConfigError

CONFIG_FILE = "config.json"
FINAL_METRICS_FILE = "final_metrics.json"
REPLACED_PREFIX = "replaced-"
SWEEP_RESULTS_FILE = "results.json"  # written by evaluation/sweep/ beside its variant runs

# Changing these does not change parameters or data at any step.
BOOKKEEPING_FIELDS = frozenset({
    "train.log_every", "train.eval_every", "train.eval_batches", "train.checkpoint_every",
    "train.keep_checkpoints", "mesh.data", "mesh.fsdp", "mesh.context",
    "mesh.tensor", "mesh.axis_rules",
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


# Fields added with a default that changed behaviour: a run recorded before the field existed
# ran with this value, not with today's default (value de-rotation landed on by default).
LEGACY_VALUES = {("model", "attention", "derotate"): False}


def upgrade_record(recorded: dict[str, Any]) -> dict[str, Any]:
  """A recorded config.json with ``LEGACY_VALUES`` filled in where the record lacks them."""
  upgraded = json.loads(json.dumps(recorded))
  for path, value in LEGACY_VALUES.items():
    node = upgraded
    for key in path[:-1]:
      node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict) and path[-1] not in node:
      node[path[-1]] = value
  return upgraded


def recorded_identity(recorded: dict[str, Any]) -> dict[str, Any]:
  """A recorded config.json with every field it lacks filled as the run behaved.

  A run written before a field existed ran with that field's default behaviour (or its
  ``LEGACY_VALUES`` entry), so a field added with a default must not make the run "different".
  Records that no longer parse (a field removed or renamed) are compared as they are, so the
  differing field is still named.
  """
  try:
    return config_json(config_lib.from_dict(upgrade_record(recorded)))
  except ConfigError:
    return recorded


@contextlib.contextmanager
def locked(workdir: str, purpose: str, **kwargs) -> Iterator[None]:
  """Holds ``workdir``'s run lock (``run_lock.hold``; ``kwargs`` as there) for the block.

  Processes of one multi-process job share the directory: process 0 holds it for them all.
  """
  if jax.process_index() != 0:
    yield
    return
  with run_lock.hold(run_lock.directory_lock(workdir), purpose, what=f"workdir {workdir!r}",
                     **kwargs):
    yield


def require_directory(workdir: str) -> None:
  """ConfigError naming ``workdir`` if it, or the nearest part of its path that exists, is not
  a directory (``os.makedirs`` would fail there after other work had started)."""
  path = os.path.abspath(workdir)
  while not os.path.exists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  if not os.path.isdir(path):
    where = "is a file" if path == os.path.abspath(workdir) else f"lies under the file {path!r}"
    raise ConfigError(f"--workdir {workdir!r} {where}, not a directory: pass a directory path "
                      "(it is created if missing)")


def read_config(workdir: str) -> Config:
  """The config recorded in ``workdir``; ConfigError naming the directory if there is none."""
  require_directory(workdir)
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    runs = sorted(name for name in os.listdir(workdir) if os.path.isfile(
        os.path.join(workdir, name, CONFIG_FILE))) if os.path.isdir(workdir) else []
    sweep_results = os.path.isfile(os.path.join(workdir, SWEEP_RESULTS_FILE))
    if runs or sweep_results:  # a sweep directory: say which commands read it
      variant = (f"evaluate a variant with `python eval.py --workdir "
                 f"{os.path.join(workdir, runs[0])}`, or " if runs else "")
      held = f"runs {', '.join(runs)}" if runs else f"its {SWEEP_RESULTS_FILE}"
      raise ConfigError(
          f"workdir {workdir!r} holds a sweep ({held}), not one run: {variant}rerun the sweep "
          f"with `{_sweep_command(workdir)}`")
    raise ConfigError(f"workdir {workdir!r} holds no run ({CONFIG_FILE} missing)")
  with open(path) as f:
    return config_lib.from_dict(upgrade_record(json.load(f)))


def _sweep_command(workdir: str) -> str:
  """The command recorded in the sweep's results.json, or its general form."""
  try:
    with open(os.path.join(workdir, SWEEP_RESULTS_FILE)) as f:
      command = json.load(f).get("command", "")
  except (OSError, ValueError, AttributeError):
    command = ""
  return command or f"python eval.py --config configs/sweeps/<name>.py --workdir {workdir}"


def recorded_differences(workdir: str, config: Config) -> dict[str, tuple[Any, Any]] | None:
  """How ``config`` differs from the run recorded in ``workdir`` (None: nothing recorded).

  field -> (recorded, new), the recorded side default-filled (``recorded_identity``); includes
  ``BOOKKEEPING_FIELDS`` (see ``blocking`` for the fields that make it another run).
  """
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return differences(recorded_identity(json.load(f)), config_json(config))


def blocking(diff: dict[str, tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
  """The differences that make a recorded run another run (all but bookkeeping fields)."""
  return {k: v for k, v in diff.items() if k not in BOOKKEEPING_FIELDS}


def prepare(workdir: str, config: Config, overwrite: bool = False) -> None:
  """Claims ``workdir`` for ``config`` (see module docstring). Only process 0 writes."""
  require_directory(workdir)
  path = os.path.join(workdir, CONFIG_FILE)
  new = config_json(config)
  writer = jax.process_index() == 0
  diff = recorded_differences(workdir, config)
  if diff is not None:
    other_run = blocking(diff)
    if other_run and not overwrite:
      lines = "\n".join(f"  {k}: {a!r} -> {b!r}" for k, (a, b) in other_run.items())
      raise ConfigError(
          f"workdir {workdir!r} holds a different run; differing config fields:\n{lines}\n"
          "pass --overwrite to move that run aside, or choose another --workdir")
    if other_run and writer:
      _move_aside(workdir)
    elif diff:
      logging.info("workdir %s: bookkeeping fields changed: %s", workdir, diff)
  if writer:
    os.makedirs(workdir, exist_ok=True)
    write_text(path, json.dumps(new, indent=2, sort_keys=True))
  if jax.process_count() > 1:  # nobody opens DIR/checkpoints before a move-aside is done
    multihost_utils.sync_global_devices("chunkformer_workdir_prepared")


def _move_aside(workdir: str) -> None:
  target = os.path.join(workdir, REPLACED_PREFIX + time.strftime("%Y%m%d-%H%M%S"))
  suffix = 0
  while os.path.exists(target + (f"-{suffix}" if suffix else "")):
    suffix += 1
  target += f"-{suffix}" if suffix else ""
  os.makedirs(target)
  for name in os.listdir(workdir):  # the lock file stays: it is held while this runs
    if not name.startswith(REPLACED_PREFIX) and name != run_lock.LOCK_FILE:
      os.replace(os.path.join(workdir, name), os.path.join(target, name))
  logging.warning("workdir %s: previous run moved to %s", workdir, target)


def write_text(path: str, text: str) -> str:
  """Writes ``text`` to ``path`` atomically: a reader (or a kill) never leaves half a file."""
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(tmp, path)
  return path


def read_final_metrics(workdir: str) -> dict[str, Any] | None:
  """``DIR/final_metrics.json`` of a finished run (step, held-out metrics), or None."""
  path = os.path.join(workdir, FINAL_METRICS_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def write_json(workdir: str, name: str, payload: dict[str, Any]) -> str:
  """Atomically writes ``payload`` to ``DIR/name`` (process 0 only); returns the path."""
  path = os.path.join(workdir, name)
  if jax.process_index() == 0:
    write_text(path, json.dumps(payload, indent=2, sort_keys=True))
  return path
