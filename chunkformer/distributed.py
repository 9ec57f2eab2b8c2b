"""The one place that starts ``jax.distributed`` (multi-process training).

Arguments come from flags, falling back to the environment variables
``CHUNKFORMER_COORDINATOR`` (host:port of process 0), ``CHUNKFORMER_NUM_PROCESSES`` and
``CHUNKFORMER_PROCESS_ID``. Without a coordinator and a process count above one, nothing is
initialised and the run is single-process.
"""

from __future__ import annotations

import os

import jax
from absl import logging

from chunkformer.config import ConfigError

ENV_COORDINATOR = "CHUNKFORMER_COORDINATOR"
ENV_NUM_PROCESSES = "CHUNKFORMER_NUM_PROCESSES"
ENV_PROCESS_ID = "CHUNKFORMER_PROCESS_ID"


def _int_from(value: int | None, env: str, flag: str) -> int | None:
  if value is not None:
    return value
  text = os.environ.get(env)
  if text is None or not text.strip():
    return None
  try:
    return int(text)
  except ValueError:
    raise ConfigError(f"{flag} / ${env}: expected an integer, got {text!r}") from None


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> bool:
  """Initialises ``jax.distributed`` when a multi-process run is requested; returns whether.

  Must run before anything touches the JAX backend. On CPU, cross-process collectives use
  gloo (the default CPU backend has none).
  """
  coordinator = coordinator or os.environ.get(ENV_COORDINATOR) or None
  num_processes = _int_from(num_processes, ENV_NUM_PROCESSES, "--num_processes")
  process_id = _int_from(process_id, ENV_PROCESS_ID, "--process_id")
  if num_processes is None or num_processes == 1:
    return False
  if coordinator is None or process_id is None:
    raise ConfigError(f"--num_processes={num_processes} also needs --coordinator "
                      f"(${ENV_COORDINATOR}) and --process_id (${ENV_PROCESS_ID})")
  if not 0 <= process_id < num_processes:
    raise ConfigError(f"--process_id: {process_id} outside [0, {num_processes})")
  # Only the CPU backend reads this; GPU/TPU runs keep their own collectives.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                             process_id=process_id)
  logging.info("jax.distributed: process %d of %d, coordinator %s, %d local / %d global devices",
               jax.process_index(), jax.process_count(), coordinator, jax.local_device_count(),
               jax.device_count())
  return True
