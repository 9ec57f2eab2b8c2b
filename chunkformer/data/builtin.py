"""The built-in corpus ``data.path = "builtin:stdlib"``: the interpreter's standard library source.

The same files as the code task (``code.stdlib_files``), ingested on first use into a cache
directory, ``$CHUNKFORMER_DATA_CACHE`` or ``~/.cache/chunkformer``, one subdirectory per
(Python version, tokenizer): ``stdlib-py3.11.7-bytes``, ``stdlib-py3.11.7-bpe4096``. With
``data.tokenizer = "bpe:N"`` a byte-level BPE of N ids is first trained there on the train
split's files only (``tokenizer.json``), so held-out text stays unseen. Later runs reuse the
cache; several processes racing to create it each build a private copy and the first rename wins.
"""

from __future__ import annotations

import os
import platform
import re
import tempfile

from absl import logging

from chunkformer.data import code
from chunkformer.data import tokenizer as tokenizer_lib

PREFIX = "builtin:"
CORPORA = ("stdlib",)
BPE = re.compile(r"bpe:(\d+)$")
CACHE_ENV = "CHUNKFORMER_DATA_CACHE"


def is_builtin(path: str) -> bool:
  return path.startswith(PREFIX)


def cache_root() -> str:
  return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache",
                                                   "chunkformer")


def check_spec(path: str, tokenizer: str) -> int:
  """Validates a built-in spec; returns the largest vocabulary it can produce."""
  name = path[len(PREFIX):]
  if name not in CORPORA:
    raise ValueError(f"config field 'data.path': unknown built-in corpus {path!r}; known: "
                     + ", ".join(PREFIX + c for c in CORPORA))
  if tokenizer in ("", tokenizer_lib.BYTES):
    return tokenizer_lib.BYTE_VOCAB_SIZE
  match = BPE.match(tokenizer)
  if not match or int(match.group(1)) < 257:
    raise ValueError(f"config field 'data.tokenizer': a built-in corpus takes 'bytes' or "
                     f"'bpe:N' (N >= 257, trained in the cache), got {tokenizer!r}")
  return int(match.group(1))


def resolve(path: str, tokenizer: str, heldout_fraction: float) -> str:
  """The cache directory of the built-in corpus, ingesting (and training BPE) on first use."""
  # Imported here, not at the top: the package chunkformer.data imports this module, and
  # `python -m chunkformer.data.ingest` warns when the package has already imported ingest.
  from chunkformer.data import ingest  # noqa: PLC0415

  check_spec(path, tokenizer)
  tag = tokenizer.replace(":", "") if tokenizer.startswith("bpe:") else tokenizer_lib.BYTES
  directory = os.path.join(
      cache_root(), f"{path[len(PREFIX):]}-py{platform.python_version()}-{tag}"
      f"-heldout{heldout_fraction:g}")
  if os.path.isfile(os.path.join(directory, ingest.MANIFEST)):
    return directory
  os.makedirs(cache_root(), exist_ok=True)
  root = code.stdlib_root()
  paths = [os.path.join(root, p) for p in code.stdlib_files(root)]
  with tempfile.TemporaryDirectory(dir=cache_root()) as scratch:
    spec = tokenizer_lib.BYTES
    if tag != tokenizer_lib.BYTES:
      train = [p for p in paths
               if not code.is_heldout(os.path.relpath(p, root), heldout_fraction)]
      logging.info("training a %s tokenizer on %d standard-library files", tokenizer, len(train))
      spec = os.path.join(scratch, "tokenizer.json")
      tokenizer_lib.train_bpe(train, int(tag[3:])).save(spec)
    logging.info("ingesting the standard library (%d files) into %s", len(paths), directory)
    staging = os.path.join(scratch, "dataset")
    ingest.ingest_files(paths, root, spec, staging, heldout_fraction=heldout_fraction,
                        command=f"builtin {path} tokenizer={tokenizer}")
    try:
      os.rename(staging, directory)
    except OSError:  # another process won the race; its copy is identical
      if not os.path.isfile(os.path.join(directory, ingest.MANIFEST)):
        raise
  return directory
