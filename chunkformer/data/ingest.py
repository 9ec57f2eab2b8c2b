"""Ingestion: text, source or JSONL files -> tokenized ArrayRecord shards + manifest.json.

  python -m chunkformer.data.ingest --input 'corpus/**/*.txt' --tokenizer bytes|tok.json \\
      --output DIR [--jsonl_field text] [--heldout_fraction 0.1] [--overwrite]

A document is a whole file, or one line of a ``.jsonl`` file (its ``--jsonl_field`` string).
Its split is a stable hash of its path relative to the glob's fixed prefix (``#LINE`` appended
for JSONL lines, see ``code.is_heldout``), so a document's split never depends on the machine or
the other files. Each split's documents are written in input order as ArrayRecord records of
little-endian token ids (``manifest["dtype"]``, no BOS: the loader adds it), into
``DIR/{split}-NNNNN.array_record`` shards of at most ``SHARD_TOKENS`` tokens.

``DIR/manifest.json`` records documents, tokens and UTF-8 bytes per split, the shards, the
tokenizer (name, hash, vocab_size, bos_id), the skipped files and the command. A BPE tokenizer's
JSON is copied to ``DIR/tokenizer.json``, so the directory is self-contained. Everything is
written into a temporary sibling directory that is renamed to DIR when complete: a crash leaves
no half-written DIR, and ``--overwrite`` moves an existing DIR aside to
``DIR.replaced-<timestamp>`` (logged) instead of deleting it.

One ingestion at a time writes DIR: it holds the lock file ``PARENT/.DIR.lock`` (``run_lock``;
released when the process ends, however it ends), and a second one is refused in one line
naming the first.

Errors (``IngestError``, one line, before anything is written): a glob that matches nothing, a
missing tokenizer, an existing DIR without ``--overwrite``; after reading: no document in a
split (naming the ``--heldout_fraction`` that would give each split one). Files that are not
UTF-8 (or JSONL lines that are not JSON objects with the field) are skipped and counted; the
first few are named in the log and the manifest.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence

import numpy as np
import tqdm
from absl import logging

from chunkformer import run_lock
from chunkformer.data import code
from chunkformer.data import tokenizer as tokenizer_lib

MANIFEST = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"
SPLITS = ("train", "heldout")
SHARD_TOKENS = 1 << 24  # tokens per shard before a new one starts
NAMED_SKIPS = 5  # skipped files named in the log and the manifest
ENCODE_BATCH = 64  # documents per tokenizer call (the Rust tokenizer parallelises a batch)


class IngestError(ValueError):
  """Input that ingestion cannot turn into a dataset (names the flag, path or split)."""


def glob_root(pattern: str) -> str:
  """The directory part of ``pattern`` before its first wildcard (paths are relative to it)."""
  parts = pattern.split(os.sep)
  fixed = []
  for part in parts[:-1]:
    if glob.has_magic(part):
      break
    fixed.append(part)
  return os.sep.join(fixed) or "."


def expand(pattern: str) -> list[str]:
  paths = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
  if not paths:
    raise IngestError(f"--input {pattern!r} matches no file")
  return paths


class _Skips:
  def __init__(self):
    self.count, self.named = 0, []

  def add(self, what: str, why: str) -> None:
    self.count += 1
    if len(self.named) < NAMED_SKIPS:
      self.named.append(what)
      logging.warning("skipping %s: %s", what, why)


def _documents(path: str, name: str, jsonl_field: str,
               skips: _Skips) -> Iterator[tuple[str, str]]:
  """(document key, text) of one file."""
  with open(path, "rb") as f:
    raw = f.read()
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    skips.add(path, f"not UTF-8 ({e.reason} at byte {e.start})")
    return
  if not path.endswith(".jsonl"):
    yield name, text
    return
  for line_no, line in enumerate(text.splitlines(), 1):
    if not line.strip():
      continue
    try:
      value = json.loads(line)[jsonl_field]
      if not isinstance(value, str):
        raise TypeError(f"field {jsonl_field!r} is {type(value).__name__}, not a string")
    except (ValueError, KeyError, TypeError) as e:
      skips.add(f"{path}:{line_no}", f"no string field {jsonl_field!r} ({e})")
      continue
    yield f"{name}#{line_no}", value


class _SplitWriter:
  """Round of shards of one split; counts documents, tokens and bytes."""

  def __init__(self, directory: str, split: str, dtype: np.dtype):
    self.directory, self.split, self.dtype = directory, split, dtype
    self.shards: list[str] = []
    self.documents = self.tokens = self.bytes = 0
    self._writer, self._shard_tokens = None, 0

  def add(self, ids: Sequence[int], num_bytes: int) -> None:
    if self._writer is None or self._shard_tokens >= SHARD_TOKENS:
      self.close()
      name = f"{self.split}-{len(self.shards):05d}.array_record"
      self.shards.append(name)
      # Imported here: the probes import this module for its tokenizers, and accelerator images
      # without array_record must still run them (only writing a corpus needs it).
      from array_record.python import array_record_module  # noqa: PLC0415

      self._writer = array_record_module.ArrayRecordWriter(
          os.path.join(self.directory, name), "group_size:1")
      self._shard_tokens = 0
    self._writer.write(np.asarray(ids, self.dtype).tobytes())
    self.documents += 1
    self.tokens += len(ids)
    self._shard_tokens += len(ids)
    self.bytes += num_bytes

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
      self._writer = None

  def summary(self) -> dict:
    return {"documents": self.documents, "tokens": self.tokens, "bytes": self.bytes,
            "shards": self.shards}


def token_dtype(vocab_size: int) -> np.dtype:
  return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def _check_output(output: str, overwrite: bool) -> None:
  if os.path.exists(output) and not overwrite:
    raise IngestError(f"--output {output!r} exists; pass --overwrite to replace it (the old "
                      "directory is moved aside, not deleted)")


def ingest_files(paths: Sequence[str], root: str, tokenizer_spec: str, output: str, *,
                 jsonl_field: str = "text", heldout_fraction: float = 0.1,
                 overwrite: bool = False, command: str = "",
                 progress: bool = True) -> dict:
  """Ingests ``paths`` (documents named relative to ``root``) into ``output``; returns the manifest.

  See the module docstring for the layout and errors.
  """
  tok = tokenizer_lib.load(tokenizer_spec)
  _check_output(output, overwrite)
  if not 0.0 < heldout_fraction < 1.0:
    raise IngestError(f"--heldout_fraction must lie in (0, 1), got {heldout_fraction}")
  with run_lock.hold(run_lock.output_lock(output), "ingestion", what=f"--output {output!r}"):
    _check_output(output, overwrite)  # again: the previous holder may have just written it
    return _ingest_locked(paths, root, tok, tokenizer_spec, output, jsonl_field,
                          heldout_fraction, command, progress)


def _ingest_locked(paths, root, tok, tokenizer_spec, output, jsonl_field, heldout_fraction,
                   command, progress) -> dict:
  parent = os.path.dirname(os.path.abspath(output))
  staging = tempfile.mkdtemp(prefix=f".{os.path.basename(output)}.tmp-", dir=parent)
  try:
    manifest = _write(paths, root, tok, tokenizer_spec, staging, jsonl_field, heldout_fraction,
                      command, progress)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  if os.path.exists(output):
    aside = f"{output.rstrip(os.sep)}.replaced-{time.strftime('%Y%m%d-%H%M%S')}"
    os.replace(output, aside)
    logging.warning("--overwrite: moved the previous %s to %s", output, aside)
  os.replace(staging, output)
  return manifest


def _write(paths, root, tok, tokenizer_spec, directory, jsonl_field, heldout_fraction, command,
           progress) -> dict:
  dtype = token_dtype(tok.vocab_size)
  writers = {s: _SplitWriter(directory, s, dtype) for s in SPLITS}
  skips = _Skips()
  began = time.perf_counter()
  pending: list[tuple[str, str]] = []
  scores: list[float] = []  # code.heldout_score of every written document

  def flush():
    ids = ([tok.encode(t) for _, t in pending] if tok.backend is None else
           [e.ids for e in tok.backend.encode_batch([t for _, t in pending],
                                                    add_special_tokens=False)])
    for (key, text), doc in zip(pending, ids, strict=True):
      if doc:
        scores.append(code.heldout_score(key))
        split = "heldout" if scores[-1] < heldout_fraction else "train"
        writers[split].add(doc, len(text.encode("utf-8")))
    pending.clear()

  bar = tqdm.tqdm(paths, unit="file", disable=not progress, mininterval=1.0,
                  desc=f"ingest ({tok.name})")
  for path in bar:
    name = os.path.relpath(path, root).replace(os.sep, "/")
    pending.extend(_documents(path, name, jsonl_field, skips))
    if len(pending) >= ENCODE_BATCH:
      flush()
      docs = sum(w.documents for w in writers.values())
      bar.set_postfix(docs=docs, docs_per_s=f"{docs / (time.perf_counter() - began):.0f}",
                      refresh=False)
  flush()
  for w in writers.values():
    w.close()
  if skips.count:
    logging.warning("skipped %d undecodable files or lines (first: %s)", skips.count,
                    ", ".join(skips.named))
  for split, w in writers.items():
    if not w.documents:
      advice = _split_advice(split, scores, heldout_fraction)
      raise IngestError(
          f"no document in split {split!r} ({len(scores)} documents from {len(paths)} files, "
          f"{skips.count} skipped as undecodable): {advice}")
  tokenizer_info = {"spec": tokenizer_spec, "name": tok.name, "hash": tok.hash,
                    "vocab_size": tok.vocab_size, "bos_id": tok.bos_id}
  if tok.backend is not None:
    tok.backend.save(os.path.join(directory, TOKENIZER_FILE))
    tokenizer_info["file"] = TOKENIZER_FILE
  manifest = {
      "format": 1,
      "dtype": dtype.str,
      "tokenizer": tokenizer_info,
      "splits": {s: w.summary() for s, w in writers.items()},
      "heldout_fraction": heldout_fraction,
      "skipped": {"count": skips.count, "first": skips.named},
      "files": len(paths),
      "command": command,
      "seconds": round(time.perf_counter() - began, 2),
  }
  with open(os.path.join(directory, MANIFEST), "w") as f:
    json.dump(manifest, f, indent=2)
  return manifest


def _split_advice(split: str, scores: Sequence[float], heldout_fraction: float) -> str:
  """What to change when ``split`` got no document: the --heldout_fraction that gives it one."""
  rule = (f"a document is held out when a hash of its name, a fraction in [0, 1), falls below "
          f"--heldout_fraction ({heldout_fraction:g})")
  if len(scores) < 2:
    return f"{rule}; two splits need at least two documents: add documents"
  ordered = sorted(scores)
  if split == "heldout":  # the smallest cut above the lowest score, below the next one
    cut = _round_between(ordered[0], ordered[1])
    return f"{rule}; --heldout_fraction {cut:g} holds out one of these documents (or add more)"
  cut = _round_between(ordered[-2], ordered[-1])
  return f"{rule}; --heldout_fraction {cut:g} keeps one of these documents for training"


def _round_between(a: float, b: float) -> float:
  """A short decimal in (a, b] (a < b): the cut the advice names."""
  for digits in range(1, 17):
    cut = math.ceil(a * 10**digits + 1e-12) / 10**digits
    if a < cut <= b:
      return cut
  return b


def ingest(pattern: str, tokenizer_spec: str, output: str, **kwargs) -> dict:
  """``ingest_files`` over the files matching ``pattern`` (``**`` recurses)."""
  tokenizer_lib.load(tokenizer_spec)  # bad tokenizer and bad output fail before the glob walks
  _check_output(output, kwargs.get("overwrite", False))
  return ingest_files(expand(pattern), glob_root(pattern), tokenizer_spec, output, **kwargs)


def read_manifest(directory: str) -> dict:
  """The manifest of an ingested directory; raises IngestError naming the path."""
  path = os.path.join(directory, MANIFEST)
  if not os.path.isfile(path):
    raise IngestError(f"{directory!r} holds no {MANIFEST}: not an ingested dataset (run "
                      "python -m chunkformer.data.ingest first)")
  try:
    with open(path) as f:
      return json.load(f)
  except ValueError as e:
    raise IngestError(f"{path!r} is not valid JSON ({e}): a damaged dataset, ingest it again "
                      "with python -m chunkformer.data.ingest ... --overwrite") from None


def dataset_tokenizer(directory: str, manifest: dict) -> tokenizer_lib.Tokenizer:
  """The tokenizer the shards were made with (bytes, or the copy in DIR), hash-checked."""
  info = manifest["tokenizer"]
  spec = os.path.join(directory, info["file"]) if "file" in info else tokenizer_lib.BYTES
  tok = tokenizer_lib.load(spec)
  tokenizer_lib.check_hash(info["hash"], tok, f"dataset {directory!r}")
  return tok


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m chunkformer.data.ingest")
  parser.add_argument("--input", required=True, help="glob of files ('**' recurses)")
  parser.add_argument("--tokenizer", required=True, help="'bytes' or a tokenizer.json")
  parser.add_argument("--output", required=True, help="directory to create")
  parser.add_argument("--jsonl_field", default="text", help="text field of .jsonl lines")
  parser.add_argument("--heldout_fraction", type=float, default=0.1)
  parser.add_argument("--overwrite", action="store_true")
  args = parser.parse_args(argv)
  logging.set_verbosity(logging.INFO)
  command = " ".join(["python -m chunkformer.data.ingest", *(argv or sys.argv[1:])])
  try:
    manifest = ingest(args.input, args.tokenizer, args.output, jsonl_field=args.jsonl_field,
                      heldout_fraction=args.heldout_fraction, overwrite=args.overwrite,
                      command=command)
  except (IngestError, tokenizer_lib.TokenizerError, run_lock.Locked) as e:
    sys.exit(f"error: {e}")
  for split, s in manifest["splits"].items():
    print(f"{split}: {s['documents']} documents, {s['tokens']} tokens, {s['bytes']} bytes, "
          f"{len(s['shards'])} shards")
  print(f"skipped {manifest['skipped']['count']}; wrote {args.output}/{MANIFEST}")


if __name__ == "__main__":
  main()
