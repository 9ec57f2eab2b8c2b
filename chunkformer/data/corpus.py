"""Task "corpus": a Grain pipeline over ingested ArrayRecord shards (chunkformer/data/ingest.py).

Pipeline of one process (``shard_index`` of ``shard_count``, the rows block it feeds):

  shards -> documents [shard_index::shard_count] -> (train: seeded shuffle, reshuffled each
  epoch) -> repeat -> BOS + tokens -> read threads -> ConcatThenSplit into rows of T+1 tokens
  -> batch contract -> [rows, T] batches -> background prefetch thread

Packing (Grain's ``ConcatThenSplitIterDataset``) fills every row with no padding: a document
that does not fit is split and its remainder starts the next row, as a new segment whose
positions restart at 0 (as the code task's rows start with a file's tail). Segment ids are 1, 2,
... along the row (0 only for padding, never produced by the repeating pipelines), positions
restart at each document, and ``loss_mask`` scores a target only inside its input's document:
attention, chunk pools and the loss never cross a document (the attention kinds mask by
segment id; a chunk of the fixed kind that straddles a document start pools only the new
document's tokens, and the dynamic kind's boundaries always open a chunk at a document start).

Needles (``needles > 0``, byte tokenizer): the planted-needle code task as a transform of this
pipeline. Documents are packed into code streams of ``code_needles.stream_len`` tokens with
FILE_SEP in place of each BOS, and a seeded random map (Grain's, so its rng is part of the
iterator state) plants the needle lines and appends the queries with ``code_needles.plant``:
each row is then ONE document carrying ``near_mask``/``far_mask``, as in task "code".

Batches carry the contract of chunkformer/data/__init__.py plus ``target_bytes`` (float32, the
UTF-8 bytes of each scored target, 0 where unscored), from which held-out loss converts to bits
per byte comparably across tokenizers.

Determinism and resumption: the training iterator's position is Grain state (``get_state`` /
``set_state``), saved in the Orbax checkpoint through ``grain.checkpoint``; a resumed run
therefore sees exactly the batches the uninterrupted one would have. Held-out batch i is the
i-th batch of the unshuffled held-out pipeline, so every evaluation scores the same rows.
Sharding is by document, so the global batch depends on the process count (it is the same for
any number of devices per process).
"""

from __future__ import annotations

import dataclasses
import os

import grain
import numpy as np
from grain.experimental import ConcatThenSplitIterDataset, ThreadPrefetchIterDataset

from chunkformer.data import code, code_needles, ingest
from chunkformer.data import tokenizer as tokenizer_lib

PREFETCH_BATCHES = 4  # batches the background thread keeps ready
READ_BUFFER = 256  # documents read ahead per read thread


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
  """An ingested directory: its manifest, tokenizer and per-token byte counts."""

  directory: str
  manifest: dict
  tokenizer: tokenizer_lib.Tokenizer
  token_bytes: np.ndarray  # float32 [vocab_size]

  @property
  def hash(self) -> str:
    return self.manifest["tokenizer"]["hash"]

  def shard_paths(self, split: str) -> list[str]:
    return [os.path.join(self.directory, s) for s in self.manifest["splits"][split]["shards"]]


def open_dataset(directory: str, tokenizer_spec: str = "") -> Dataset:
  """Reads ``directory``'s manifest; ``tokenizer_spec`` (if given) must hash like the shards'.

  Raises IngestError for a directory without a manifest and TokenizerError (both hashes in the
  message) for a tokenizer that differs from the one the shards were made with.
  """
  manifest = ingest.read_manifest(directory)
  tok = ingest.dataset_tokenizer(directory, manifest)
  if tokenizer_spec:
    tokenizer_lib.check_hash(manifest["tokenizer"]["hash"], tokenizer_lib.load(tokenizer_spec),
                             f"dataset {directory!r}")
  return Dataset(directory, manifest, tok, tok.token_bytes())


def documents(dataset: Dataset, split: str) -> grain.MapDataset:
  """The split's documents as int32 token arrays (BOS first when the tokenizer has one)."""
  dtype = np.dtype(dataset.manifest["dtype"])
  bos = dataset.tokenizer.bos_id
  prefix = np.array([] if bos is None else [bos], np.int32)

  def decode(record: bytes) -> dict[str, np.ndarray]:
    return {"tokens": np.concatenate([prefix, np.frombuffer(record, dtype).astype(np.int32)])}

  source = grain.sources.ArrayRecordDataSource(dataset.shard_paths(split))
  return grain.MapDataset.source(source).map(decode)


def to_row(packed: dict[str, np.ndarray], token_bytes: np.ndarray) -> dict[str, np.ndarray]:
  """One packed row of T+1 tokens -> the [T] arrays of the batch contract (+ target_bytes)."""
  tokens = packed["tokens"]
  segments = packed["tokens_segment_ids"]
  inputs, targets = tokens[:-1], tokens[1:]
  scored = ((segments[1:] == segments[:-1]) & (segments[:-1] > 0)).astype(np.float32)
  return {
      "inputs": inputs,
      "targets": targets,
      "loss_mask": scored,
      "positions": packed["tokens_positions"][:-1],
      "segment_ids": segments[:-1],
      "target_bytes": token_bytes[targets] * scored,
  }


def needle_row(packed: dict[str, np.ndarray], rng: np.random.Generator, token_bytes: np.ndarray,
               *, seq_len: int, needles: int, near_distance: int) -> dict[str, np.ndarray]:
  """A packed code stream (documents start with BOS) -> a needle row (+ target_bytes)."""
  stream = np.where(packed["tokens"] == code.BOS, code.FILE_SEP, packed["tokens"])
  row = code_needles.plant(rng, stream.astype(np.int32), seq_len=seq_len, needles=needles,
                           near_distance=near_distance)
  row["target_bytes"] = token_bytes[row["targets"]] * row["loss_mask"]
  return row


def pipeline(dataset: Dataset, split: str, *, seq_len: int, rows: int, seed: int,
             shard_index: int = 0, shard_count: int = 1, read_threads: int = 2,
             needles: int = 0, near_distance: int = 0) -> grain.IterDataset:
  """Endless [rows, seq_len] batches of ``split`` for process ``shard_index`` of ``shard_count``.

  ``read_threads`` threads read and decode documents; packing and batching run in one
  background thread (``PREFETCH_BATCHES`` ahead). Same arguments, same batches. ``needles``
  plants that many needles per row (byte-level shards only; see the module docstring).
  """
  if needles and dataset.tokenizer.bos_id != code.BOS:
    raise ingest.IngestError(
        f"dataset {dataset.directory!r}: needles are planted into byte-level shards (tokenizer "
        f"'bytes'), not {dataset.tokenizer.name!r}")
  docs = documents(dataset, split)
  if len(docs) < shard_count:
    raise ingest.IngestError(
        f"dataset {dataset.directory!r} split {split!r} has {len(docs)} documents, fewer than "
        f"the {shard_count} processes that each read a disjoint share")
  docs = docs[shard_index::shard_count]
  if split == "train":
    docs = docs.shuffle(seed)  # repeat() below reseeds it for every epoch
  docs = docs.repeat()
  length = code_needles.stream_len(seq_len, needles) if needles else seq_len + 1
  packed = ConcatThenSplitIterDataset(
      docs.to_iter_dataset(grain.ReadOptions(num_threads=read_threads,
                                             prefetch_buffer_size=READ_BUFFER)),
      length_struct={"tokens": length})
  token_bytes = dataset.token_bytes
  if needles:
    split_seed = seed * 2 + (split == "heldout")  # the splits' needles are independent
    made = packed.random_map(
        lambda p, rng: needle_row(p, rng, token_bytes, seq_len=seq_len, needles=needles,
                                  near_distance=near_distance), seed=split_seed)
  else:
    made = packed.map(lambda p: to_row(p, token_bytes))
  batches = made.batch(rows, drop_remainder=True)
  return ThreadPrefetchIterDataset(batches, prefetch_buffer_size=PREFETCH_BATCHES)
