"""Run a script of the repository in a subprocess on N fake CPU devices (the multi-device tests).

XLA reads the device count when JAX starts, so a test that needs a mesh runs its worker in a
fresh interpreter with ``--xla_force_host_platform_device_count``.
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args, *, devices: int, timeout: int) -> subprocess.CompletedProcess:
  """``python *args`` from the repository root on ``devices`` fake CPU devices; asserts that it
  succeeded (the failure shows the end of its stderr)."""
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  result = subprocess.run([sys.executable, *map(str, args)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
  assert result.returncode == 0, result.stderr[-4000:]
  return result
