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
