"""Test-session setup shared by every test module (and the subprocesses they start).

A persistent compilation cache in a per-user temp directory lets repeated compiles of the
same program (subprocess runs of train.py, resumed runs, xdist workers) load instead of
recompiling; it changes no numerics.

XLA's backend optimisations are off (``JAX_DISABLE_MOST_OPTIMIZATIONS``): at test sizes LLVM's
passes cost more than the programs take to run (the suite ran in 693 s instead of 927 s on
2 cores, bench/results/measurements.md). The flag reaches only the CPU backend's code
generation, not XLA's HLO passes: the SPMD partitioner, buffer assignment and the HLO text
the collective and memory checks read are the ones an optimised compile makes (checked: a
context-parallel training step's compiled HLO text and memory analysis are identical with it
on and off). Set it to 0 to run the suite on optimised programs.

XLA's CPU thread pools get at least 8 threads (``PJRT_NPROC``; XLA sizes them to the cores
otherwise): the Mosaic GPU interpreter holds one worker per warpgroup at a barrier plus one for
its grid loop, and on 2 cores it deadlocked (``kernels.attention_mgpu.check_interpreter_threads``;
``tests/test_kernels_mosaic.py`` gives the counts).
"""

import os
import tempfile

os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(tempfile.gettempdir(), f"chunkformer-test-jax-cache-{os.getuid()}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
os.environ.setdefault("PJRT_NPROC", str(max(8, os.cpu_count() or 1)))
# (JAX reads all four when it starts: no test module may import it before this file runs.)

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _studies_installed():
  """Every test sees the studies' probes, claims and report hooks, as eval.py does (imported
  here, not at the top, so no JAX import precedes the environment above)."""
  from chunkformer import studies
  studies.install()
