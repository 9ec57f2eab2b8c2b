"""Test-session setup shared by every test module (and the subprocesses they start).

A persistent compilation cache in a per-user temp directory lets repeated compiles of the
same program (subprocess runs of train.py, resumed runs, xdist workers) load instead of
recompiling; it changes no numerics.
"""

import os
import tempfile

os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(tempfile.gettempdir(), f"chunkformer-test-jax-cache-{os.getuid()}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


import jax  # noqa: E402  (after the cache settings above, which must precede jax's start)
import pytest  # noqa: E402


@pytest.fixture(scope="module")
def fast_compiles():
  """Interpret-mode kernels are large XLA programs; optimising them costs more than running
  them, so modules that compile many of them skip XLA's optimisations."""
  previous = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", True)
  yield
  jax.config.update("jax_disable_most_optimizations", previous)
