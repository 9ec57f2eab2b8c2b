"""Which matrix instructions the compiled kernels use, read from an XLA dump (``--xla_dump_to``).

  python -m bench.device_isa DUMP_DIR     # prints a table; bench.accelerator --isa calls it

Per kernel (each ``.entry`` of every PTX file; SASS text too if a ``.sass`` file is there) the
count of Hopper warpgroup MMAs (``wgmma.mma_async`` in PTX, ``HGMMA`` in SASS), Ampere-style
warp MMAs (``mma.sync``, ``HMMA``) and ``wmma``. A Hopper kernel whose dots run on ``mma.sync``
only leaves most of the tensor cores' throughput unused (the FlashAttention-3 / Mosaic GPU
kernels issue wgmma). Files other than PTX/SASS (HLO text) are listed with their custom calls,
so an empty result says whether the dump held GPU code at all.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

INSTRUCTIONS = {
    "wgmma": re.compile(r"\bwgmma\.mma_async\b|\bHGMMA\b"),
    "mma.sync": re.compile(r"\bmma\.sync\b|\bHMMA\b"),
    "wmma": re.compile(r"\bwmma\.mma\b"),
}
_ENTRY = re.compile(r"^\s*(?:\.visible\s+)?\.entry\s+([\w$.]+)", re.M)
_SASS_FUNCTION = re.compile(r"^\s*(?:Function|\.text\.)\s*:?\s*([\w$.]+)", re.M)


def _counts(text: str) -> dict[str, int]:
  return {name: len(p.findall(text)) for name, p in INSTRUCTIONS.items()}


def _split(text: str, pattern: re.Pattern) -> dict[str, str]:
  """Kernel name -> its body (from one header to the next)."""
  heads = list(pattern.finditer(text))
  return {m.group(1): text[m.end():(heads[i + 1].start() if i + 1 < len(heads) else len(text))]
          for i, m in enumerate(heads)}


def scan(dump_dir: str) -> dict:
  """{"kernels": [{file, kernel, wgmma, mma.sync, wmma}], "files": n, "code_files": n}."""
  kernels, files, code = [], 0, 0
  for directory, _, names in os.walk(dump_dir):
    for name in sorted(names):
      path = os.path.join(directory, name)
      files += 1
      if not name.endswith((".ptx", ".sass")):
        continue
      code += 1
      text = open(path, errors="replace").read()
      pattern = _ENTRY if name.endswith(".ptx") else _SASS_FUNCTION
      for kernel, body in (_split(text, pattern) or {"<file>": text}).items():
        kernels.append(dict(file=os.path.relpath(path, dump_dir), kernel=kernel,
                            **_counts(body)))
  return dict(kernels=kernels, files=files, code_files=code)


def markdown(result: dict) -> list[str]:
  """Lines of the report section (kernels with any matrix instruction, or why there are none)."""
  lines = ["## Matrix instructions of the compiled kernels", "",
           f"{result['files']} files dumped, {result['code_files']} with GPU code (PTX/SASS)."]
  used = [k for k in result["kernels"] if any(k[n] for n in INSTRUCTIONS)]
  if not used:
    return lines + ["No kernel with a matrix instruction was found."]
  lines += ["", "| kernel | file | " + " | ".join(INSTRUCTIONS) + " |",
            "|---|---|" + "---|" * len(INSTRUCTIONS)]
  for k in used:
    lines.append(f"| {k['kernel']} | {k['file']} | "
                 + " | ".join(str(k[n]) for n in INSTRUCTIONS) + " |")
  return lines


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("dump_dir", help="the folder XLA dumped into (--xla_dump_to)")
  args = parser.parse_args(argv[1:])
  if not os.path.isdir(args.dump_dir):
    parser.error(f"{args.dump_dir}: no such folder")
  print("\n".join(markdown(scan(args.dump_dir))))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
