"""Where a written result came from: the commit of this checkout (benchmarks, probes)."""

from __future__ import annotations

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def commit() -> str:
  """The short hash of this checkout's HEAD ('' outside a git checkout)."""
  return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                        text=True).stdout.strip()
