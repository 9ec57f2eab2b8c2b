"""Flags shared by the entry points (train.py, eval.py) and what they turn into.

Flag definitions live here so that every entry point spells them the same way; each entry
point defines only the groups it uses.
"""

from __future__ import annotations

import logging as std_logging
import os
import re

import jax
from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from chunkformer import config as config_lib
from chunkformer import distributed


def define_config_flag(required: bool = True) -> flags.FlagHolder:
  """``--config configs/x.py[:arg]`` plus ``--config.a.b=v`` overrides (typos fail loudly)."""
  holder = config_flags.DEFINE_config_file(
      "config", None, "ml_collections config file, e.g. configs/smoke.py", lock_config=True)
  if required:
    flags.mark_flag_as_required("config")
  return holder


def parse_flags(argv: list[str]) -> list[str]:
  """``app.run``'s flag parser, except that a bad ``--config.a.b=v`` override (a typo in a field
  name, a value of the wrong type) ends in one line naming it instead of a traceback."""
  try:
    return app.parse_flags_with_usage(argv)  # absl's own flag errors: usage line, exit 1
  except (AttributeError, KeyError, TypeError, ValueError) as e:
    raise SystemExit(f"error: {_override_error(argv, e)}") from None


def _override_error(argv: list[str], error: Exception) -> str:
  text = error.args[0] if error.args and isinstance(error.args[0], str) else str(error)
  # ml_collections nests a KeyError's repr in the AttributeError: undo its escapes.
  text = text.replace("\\n", " ").replace("\\'", "'").replace("\\", "")
  text = " ".join(text.split()).strip("'\" ")
  name = re.match(r"'?([A-Za-z_][A-Za-z0-9_]*)'?", text)
  overrides = [a for a in argv[1:] if a.startswith("--config.")]
  culprit = next((a for a in overrides if name and re.search(
      rf"\.{re.escape(name.group(1))}(=|$|\.)", a.split("=")[0] + "=")), None)
  hint = re.search(r'Did you mean "([^"]+)"', text)
  if culprit and isinstance(error, (AttributeError, KeyError)):
    field = culprit.split("=")[0][len("--config."):]
    return (f"{culprit}: the config has no field {field!r}"
            + (f" (did you mean {hint.group(1)!r}?)" if hint else "")
            + "; fields are listed in configs/base.py")
  return f"bad --config override ({' '.join(overrides) or 'none given'}): {text}"


def define_workdir_flag() -> flags.FlagHolder:
  holder = flags.DEFINE_string("workdir", None, "run directory: config, checkpoints, events")
  flags.mark_flag_as_required("workdir")
  return holder


def define_overwrite_flag() -> flags.FlagHolder:
  return flags.DEFINE_bool(
      "overwrite", False, "if --workdir holds a different run, move it into "
      "DIR/replaced-<timestamp>/ and start afresh (otherwise such a rerun is refused)")


def define_distributed_flags() -> None:
  flags.DEFINE_string("coordinator", None,
                      f"host:port of process 0 (default ${distributed.ENV_COORDINATOR})")
  flags.DEFINE_integer("num_processes", None,
                       f"processes in the job (default ${distributed.ENV_NUM_PROCESSES})")
  flags.DEFINE_integer("process_id", None,
                       f"this process' index (default ${distributed.ENV_PROCESS_ID})")


def initialize_distributed() -> bool:
  """Starts jax.distributed from the distributed flags; call before touching devices."""
  f = flags.FLAGS
  return distributed.initialize(f.coordinator, f.num_processes, f.process_id)


def config_from_flags(holder: flags.FlagHolder) -> config_lib.Config:
  """The frozen, validated Config of ``--config`` (ConfigError naming a bad field)."""
  return config_lib.from_dict(holder.value.to_dict())


def one_line_error(error: Exception) -> str:
  """The ``error: ...`` line an entry point exits with for an expected failure (bad input, a
  locked directory, a non-finite loss); the traceback is logged at --verbosity=1."""
  absl_logging.debug("traceback of the error below", exc_info=error)
  return f"error: {error}"


def quiet_library_logs() -> None:
  """Hides libraries' INFO lines (Orbax narrates every save); their warnings still show."""
  def keep(record: std_logging.LogRecord) -> bool:
    return record.levelno >= std_logging.WARNING or "site-packages" not in record.pathname

  absl_logging.get_absl_handler().addFilter(keep)


def enable_compilation_cache() -> None:
  """Persists compiled programs (default ~/.cache/chunkformer/jax, or $JAX_COMPILATION_CACHE_DIR)
  so that a rerun, e.g. resuming after preemption, skips recompiling."""
  if not jax.config.jax_compilation_cache_dir:
    jax.config.update("jax_compilation_cache_dir",
                      os.path.join(os.path.expanduser("~"), ".cache", "chunkformer", "jax"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
