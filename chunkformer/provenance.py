"""Where a written result came from: the commit of this checkout (benchmarks, probes), and the
state of a file in git (a sweep's pre-registered plan)."""

from __future__ import annotations

import hashlib
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def commit() -> str:
  """The short hash of this checkout's HEAD ('' outside a git checkout).

  ``CHUNKFORMER_COMMIT``, where set, overrides it: a copy of the tree sent to another machine
  can carry a stale ``.git`` (an accelerator's copy answered with the session's first commit).
  """
  named = os.environ.get("CHUNKFORMER_COMMIT")
  if named:
    return named
  return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                        text=True).stdout.strip()


def _git(directory: str, *args: str) -> str:
  return subprocess.run(["git", "-C", directory, *args], capture_output=True,
                        text=True).stdout.strip()


def file_state(path: str) -> dict[str, object]:
  """A file as a pre-registered plan is named: its path, sha256, the commit that last touched
  it (``git log -1 -- path``; '' when git does not know it) and whether it is committed
  unchanged (tracked, no difference from HEAD)."""
  path = os.path.abspath(path)
  with open(path, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  directory, name = os.path.split(path)
  last = _git(directory, "log", "-1", "--format=%H", "--", name)
  tracked = bool(_git(directory, "ls-files", "--", name))
  changed = bool(_git(directory, "status", "--porcelain", "--", name))
  return {"path": path, "sha256": digest, "commit": last,
          "committed": bool(last) and tracked and not changed}
