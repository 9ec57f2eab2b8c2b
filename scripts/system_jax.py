"""``CHUNKFORMER_JAX=system``: run on the JAX an accelerator image brings, installing only what
it lacks.

Run by ``run.sh`` with the image's own Python (standard library only: it must run before
anything is installed):

  python scripts/system_jax.py requirements.lock [requirements-test.lock ...]

prints one line ``jax=<version> missing=<name==pin,...>`` (``-`` when nothing is missing): the
pins of the locks (jax, jaxlib and accelerator plugins excepted: those are the image's) whose
package the image does not have at any version. A package the image has at another version is
kept (the image's stack is what runs; ``requirements-h200.lock`` records one such stack). It
exits 2 with one ``error: ...`` line when the image's JAX cannot work: none, or a version
outside ``TESTED`` (the oldest and newest JAX the project has run on).
"""

from __future__ import annotations

import importlib.metadata
import re
import sys

# The oldest and newest JAX this project has run on: 0.10.2 (requirements.lock, CPU; the whole
# suite) and 0.11.2 (the image of bench/results/accelerator_nvidia-h200.md, CUDA 13 plugin).
TESTED = ((0, 10, 2), (0, 11, 2))
# Left to the image: JAX itself and its accelerator plugins and the libraries they bring.
IMAGE_OWNED = re.compile(r"^(jax|jaxlib|jax-cuda\d+-(plugin|pjrt)|libtpu|nvidia-.*)$")


def _version_tuple(version: str) -> tuple[int, ...]:
  return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3])


def _canonical(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def refusal(jax_version: str | None) -> str | None:
  """The one-line reason the image's JAX cannot serve, or None."""
  low, high = (".".join(map(str, v)) for v in TESTED)
  if jax_version is None:
    return ("error: CHUNKFORMER_JAX=system: this Python has no jax; use an image with JAX "
            f"{low}..{high} or CHUNKFORMER_JAX=cpu|cuda12|tpu")
  if not TESTED[0] <= _version_tuple(jax_version) <= TESTED[1]:
    return (f"error: CHUNKFORMER_JAX=system: the image's jax {jax_version} is outside the tested "
            f"range {low}..{high}; use CHUNKFORMER_JAX=cpu|cuda12|tpu")
  return None


def missing(lock_lines: list[str], installed: set[str]) -> list[str]:
  """The lock's ``name==pin`` lines whose package is not installed (image-owned ones never)."""
  out = []
  for line in lock_lines:
    line = line.split("#")[0].strip()
    if "==" not in line:
      continue
    name = line.split("==")[0].strip()
    if IMAGE_OWNED.match(_canonical(name)) or _canonical(name) in installed:
      continue
    out.append(line)
  return out


def _installed() -> set[str]:
  return {_canonical(d.metadata["Name"]) for d in importlib.metadata.distributions()
          if d.metadata["Name"]}


def main(argv: list[str]) -> int:
  if len(argv) < 2:
    print("usage: python scripts/system_jax.py LOCK [LOCK ...]", file=sys.stderr)
    return 2
  try:
    jax_version = importlib.metadata.version("jax")
  except importlib.metadata.PackageNotFoundError:
    jax_version = None
  refused = refusal(jax_version)
  if refused is not None:
    print(refused, file=sys.stderr)
    return 2
  lines = []
  for lock in argv[1:]:
    with open(lock) as f:
      lines += f.read().splitlines()
  need = missing(lines, _installed())
  print(f"jax={jax_version} missing={','.join(need) or '-'}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
