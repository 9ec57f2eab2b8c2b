"""chunkformer ships two more top-level packages, ``kernels`` and ``configs``. Their names are
generic (a package called ``kernels`` is on the public index and used by other model
libraries), so another one found first on ``sys.path`` would be imported in their place and
fail later in confusing ways. ``check()`` (run when ``chunkformer`` is imported) refuses that
at once, naming what was found and what to do.
"""

from __future__ import annotations

import importlib.util
import os
import sys

OWN = ("kernels", "configs")  # top-level packages installed beside chunkformer


def _origin(name: str) -> str | None:
  """Where ``import name`` takes (or took) the package from, without importing it."""
  module = sys.modules.get(name)
  if module is not None:
    return getattr(module, "__file__", None) or "<no file: a namespace or built-in module>"
  try:
    spec = importlib.util.find_spec(name)
  except (ImportError, ValueError):
    return None
  return None if spec is None else (spec.origin or "<no file: a namespace package>")


def check() -> None:
  """ImportError naming the package if ``kernels`` or ``configs`` is not the one beside
  chunkformer (missing, or shadowed by another distribution or file)."""
  home = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  for name in OWN:
    expected = os.path.join(home, name, "__init__.py")
    origin = _origin(name)
    if origin is not None and os.path.exists(origin) and os.path.samefile(origin, expected):
      continue
    found = "is missing" if origin is None else f"resolves to {origin}"
    raise ImportError(
        f"chunkformer needs its own top-level package {name!r} ({expected}), but {name!r} "
        f"{found}: another package or module of that name comes first on sys.path (e.g. "
        f"`pip uninstall {name}` if a different distribution installed it), or put {home} "
        f"first (run from there, or PYTHONPATH={home})")
