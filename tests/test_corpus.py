"""Real corpora: tokenizers, ingestion to shards, the Grain packing pipeline and its errors.

Everything runs on tiny corpora written into tmp dirs; training-loop checks (resume, isolation
of packed documents by gradient) live in test_corpus_train.py.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest
from array_record.python import array_record_module

from chunkformer.config import ConfigError
from chunkformer.data import corpus, feed, ingest
from chunkformer.data import tokenizer as tokenizer_lib

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "naïve café — 日本語 ✓\n",
    "class Point:\n    x: int = 0\n    y: int = 0\n",
    "import os\nprint(os.getcwd())\n",
    "\t\t  mixed   whitespace \r\n and tabs\n",
] + [f"value_{i} = {i * i}  # document {i}\n" * (1 + i % 5) for i in range(40)]


def write_corpus(directory, texts=TEXTS, undecodable=0, jsonl=()):
  os.makedirs(directory, exist_ok=True)
  for i, text in enumerate(texts):
    with open(os.path.join(directory, f"doc_{i:03d}.txt"), "w", encoding="utf-8") as f:
      f.write(text)
  for i in range(undecodable):
    with open(os.path.join(directory, f"bad_{i}.txt"), "wb") as f:
      f.write(b"\xff\xfe\x00 not utf-8 \xc3\x28")
  if jsonl:
    with open(os.path.join(directory, "lines.jsonl"), "w") as f:
      f.write("\n".join(jsonl) + "\n")
  return os.path.join(directory, "*")


@pytest.fixture(scope="module")
def bpe_path(tmp_path_factory):
  base = tmp_path_factory.mktemp("bpe")
  pattern = write_corpus(str(base / "text"))
  out = str(base / "tok.json")
  tokenizer_lib.main(["train", "--input", pattern, "--vocab_size", "300", "--output", out])
  return out


def read_shards(directory, manifest, split):
  docs = []
  for shard in manifest["splits"][split]["shards"]:
    reader = array_record_module.ArrayRecordReader(os.path.join(directory, shard))
    docs += [np.frombuffer(r, manifest["dtype"]) for r in reader.read_all()]
    reader.close()
  return docs


@pytest.mark.parametrize("kind", ["bytes", "bpe"])
def test_tokenizer_round_trip_preserves_every_byte(kind, bpe_path):
  tok = tokenizer_lib.load("bytes" if kind == "bytes" else bpe_path)
  table = tok.token_bytes()
  for text in TEXTS:
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert max(ids) < tok.vocab_size
    assert table[ids].sum() == len(text.encode("utf-8"))  # bits per byte counts every byte once
  if kind == "bpe":
    assert tok.bos_id == 0 and table[0] == 0
    assert len(tok.encode(TEXTS[0])) < len(TEXTS[0].encode("utf-8"))  # it learned merges


def test_tokenizer_hash_is_stable_and_content_based(bpe_path, tmp_path):
  a = tokenizer_lib.load(bpe_path)
  with open(bpe_path) as f:
    spec = json.load(f)
  reformatted = str(tmp_path / "same.json")
  with open(reformatted, "w") as f:
    json.dump(spec, f, indent=4)  # different file bytes, same tokenizer
  assert tokenizer_lib.load(reformatted).hash == a.hash
  spec["model"]["vocab"]["zzz_new"] = len(spec["model"]["vocab"])
  changed = str(tmp_path / "changed.json")
  with open(changed, "w") as f:
    json.dump(spec, f)
  assert tokenizer_lib.load(changed).hash != a.hash
  assert tokenizer_lib.load("bytes").hash != a.hash


@pytest.mark.parametrize("kind", ["bytes", "bpe"])
def test_ingestion_counts_equal_the_manifest(kind, bpe_path, tmp_path):
  lines = [json.dumps({"text": f"line {i}: ünïcode {i}", "id": i}) for i in range(12)]
  lines.append(json.dumps({"other": "no text field"}))
  pattern = write_corpus(str(tmp_path / "in"), undecodable=2, jsonl=lines)
  spec = "bytes" if kind == "bytes" else bpe_path
  out = str(tmp_path / "out")
  manifest = ingest.ingest(pattern, spec, out, heldout_fraction=0.25, command="test")
  assert manifest == json.load(open(os.path.join(out, ingest.MANIFEST)))
  tok = tokenizer_lib.load(spec)
  # The expected split of every document, computed independently of the writer.
  expected = {"train": [], "heldout": []}
  for i, text in enumerate(TEXTS):
    name = f"doc_{i:03d}.txt"
    expected["heldout" if ingest.code.is_heldout(name, 0.25) else "train"].append(text)
  for i in range(12):
    name = f"lines.jsonl#{i + 1}"
    text = f"line {i}: ünïcode {i}"
    expected["heldout" if ingest.code.is_heldout(name, 0.25) else "train"].append(text)
  for split, texts in expected.items():
    stats = manifest["splits"][split]
    docs = read_shards(out, manifest, split)
    assert stats["documents"] == len(docs) == len(texts)
    assert stats["tokens"] == sum(len(d) for d in docs) == sum(len(tok.encode(t)) for t in texts)
    assert stats["bytes"] == sum(len(t.encode("utf-8")) for t in texts)
    assert sorted(tok.decode(d) for d in docs) == sorted(texts)
  assert manifest["skipped"]["count"] == 3  # two undecodable files, one JSONL line
  assert any("bad_0.txt" in s for s in manifest["skipped"]["first"])
  assert manifest["tokenizer"]["hash"] == tok.hash and manifest["command"] == "test"


def test_ingestion_errors_name_the_problem(tmp_path):
  with pytest.raises(ingest.IngestError, match="matches no file"):
    ingest.ingest(str(tmp_path / "missing" / "*.txt"), "bytes", str(tmp_path / "out"))
  with pytest.raises(tokenizer_lib.TokenizerError, match="no such file"):
    ingest.ingest(write_corpus(str(tmp_path / "in")), str(tmp_path / "nope.json"),
                  str(tmp_path / "out"))
  only_bad = write_corpus(str(tmp_path / "bad"), texts=[], undecodable=3)
  with pytest.raises(ingest.IngestError, match="no document in split 'train'.*3 skipped"):
    ingest.ingest(only_bad, "bytes", str(tmp_path / "out"))
  assert not os.path.exists(tmp_path / "out")  # nothing half-written
  # No staging directory left; the run lock's file (.out.lock) stays by design.
  assert [p for p in os.listdir(tmp_path) if p.startswith(".out") and p != ".out.lock"] == []


def test_existing_output_is_refused_and_overwrite_keeps_the_old_copy(tmp_path):
  pattern = write_corpus(str(tmp_path / "in"))
  out = str(tmp_path / "out")
  first = ingest.ingest(pattern, "bytes", out, command="first")
  with pytest.raises(ingest.IngestError, match="exists; pass --overwrite"):
    ingest.ingest(pattern, "bytes", out)
  ingest.ingest(pattern, "bytes", out, overwrite=True, command="second")
  assert ingest.read_manifest(out)["command"] == "second"
  (aside,) = [p for p in os.listdir(tmp_path) if p.startswith("out.replaced-")]
  assert ingest.read_manifest(str(tmp_path / aside)) == first


def test_cli_errors_are_one_line(tmp_path, capsys):
  with pytest.raises(SystemExit, match="error: --input .* matches no file"):
    ingest.main(["--input", str(tmp_path / "*.none"), "--tokenizer", "bytes", "--output",
                 str(tmp_path / "o")])


def test_tokenizer_whose_hash_differs_from_the_shards_is_refused(bpe_path, tmp_path):
  out = str(tmp_path / "out")
  manifest = ingest.ingest(write_corpus(str(tmp_path / "in")), "bytes", out)
  bpe_hash = tokenizer_lib.load(bpe_path).hash
  with pytest.raises(tokenizer_lib.TokenizerError) as e:
    corpus.open_dataset(out, bpe_path)
  assert manifest["tokenizer"]["hash"] in str(e.value) and bpe_hash in str(e.value)
  with pytest.raises(ConfigError, match=f"config field 'data.tokenizer'.*{bpe_hash}"):
    feed.open_for(out, bpe_path, 0.1)
  with pytest.raises(ConfigError, match="config field 'data.path'.*no manifest.json"):
    feed.open_for(str(tmp_path / "in"), "", 0.1)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
  base = tmp_path_factory.mktemp("packing")
  # Every document repeats its own name, so that a row's text names its documents.
  texts = [f"doc{i:03d};" * (1 + (5 * i) % 7) for i in range(60)]
  ingest.ingest(write_corpus(str(base / "in"), texts=texts), "bytes", str(base / "out"),
                heldout_fraction=0.2)
  return corpus.open_dataset(str(base / "out"))


def _take(ds, n, **kwargs):
  args = dict(seq_len=32, rows=4, seed=0) | kwargs
  it = iter(corpus.pipeline(ds, "train", **args))
  out = [next(it) for _ in range(n)]
  it.close()
  return out


def test_packed_rows_keep_documents_apart(dataset):
  for batch in _take(dataset, 6):
    for key in ("inputs", "targets", "positions", "segment_ids"):
      assert batch[key].shape == (4, 32) and batch[key].dtype == np.int32
    for r in range(4):
      seg, pos = batch["segment_ids"][r], batch["positions"][r]
      inputs, targets, mask = batch["inputs"][r], batch["targets"][r], batch["loss_mask"][r]
      starts = np.flatnonzero(np.diff(seg, prepend=-1))
      assert (pos[starts] == 0).all()  # positions restart at each document
      assert (np.diff(pos)[np.diff(seg) == 0] == 1).all()
      # Every new document after the first begins with BOS; the first may be a remainder.
      assert (inputs[starts[1:]] == tokenizer_lib.BYTE_BOS).all()
      # A scored target lies in its input's document: never the next document's BOS.
      assert (targets[mask == 1] != tokenizer_lib.BYTE_BOS).all()
      np.testing.assert_array_equal(mask[:-1], seg[1:] == seg[:-1])
      np.testing.assert_array_equal(batch["target_bytes"][r], mask * (targets < 256))


def test_shuffle_is_seeded_and_the_iterator_state_resumes_exactly(dataset):
  a, b = _take(dataset, 5), _take(dataset, 5)
  c = _take(dataset, 5, seed=1)
  for x, y in zip(a, b, strict=True):
    np.testing.assert_array_equal(x["inputs"], y["inputs"])
  assert any((x["inputs"] != z["inputs"]).any() for x, z in zip(a, c, strict=True))
  it = iter(corpus.pipeline(dataset, "train", seq_len=32, rows=4, seed=0))
  for _ in range(2):
    next(it)
  state = it.get_state()
  rest = [next(it) for _ in range(3)]
  it.close()
  resumed = iter(corpus.pipeline(dataset, "train", seq_len=32, rows=4, seed=0))
  resumed.set_state(json.loads(json.dumps(state)))  # as grain.checkpoint stores it
  for x, y in zip(rest, [next(resumed) for _ in range(3)], strict=True):
    np.testing.assert_array_equal(x["inputs"], y["inputs"])
  resumed.close()


def test_two_processes_read_disjoint_halves(dataset):
  def documents_seen(index):
    seen = set()
    for batch in _take(dataset, 4, rows=2, shard_index=index, shard_count=2):
      for row in batch["inputs"]:
        seen |= set(re.findall(r"doc\d{3};", bytes(row[row < 256].astype(np.uint8)).decode()))
    return seen

  first, second = documents_seen(0), documents_seen(1)
  assert first and second and not first & second


def test_two_jax_processes_each_feed_a_disjoint_half_of_the_global_batch(dataset, tmp_path):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  procs = []
  for pid in range(2):
    env = dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=1",
               CHUNKFORMER_COORDINATOR=f"127.0.0.1:{port}", CHUNKFORMER_NUM_PROCESSES="2",
               CHUNKFORMER_PROCESS_ID=str(pid))
    cmd = [sys.executable, os.path.join(root, "tests", "corpus_process_worker.py"), "--path",
           dataset.directory, "--out", str(tmp_path / f"rows_{pid}.json")]
    procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True))
  outs = [json.load(open(tmp_path / f"rows_{pid}.json")) if p.wait(timeout=300) == 0
          else pytest.fail(p.stdout.read()[-3000:]) for pid, p in enumerate(procs)]
  seen = []
  for pid, out in enumerate(outs):
    assert out["row_block"] == [pid, 2] and out["global_shape"] == [4, 32]
    names = set()
    for batch in out["rows"]:
      assert np.asarray(batch).shape == (2, 32)  # half of the global batch of 4 rows
      for row in np.asarray(batch):
        names |= set(re.findall(r"doc\d{3};", bytes(row[row < 256].astype(np.uint8)).decode()))
    seen.append(names)
  assert seen[0] and seen[1] and not seen[0] & seen[1]


def test_needle_transform_plants_answerable_needles_in_one_document(dataset):
  from chunkformer.data import code, code_needles  # noqa: PLC0415

  k, seq_len = 2, 96
  first = _take(dataset, 3, seq_len=seq_len, needles=k, near_distance=30)
  again = _take(dataset, 3, seq_len=seq_len, needles=k, near_distance=30)
  for batch, same in zip(first, again, strict=True):
    np.testing.assert_array_equal(batch["inputs"], same["inputs"])  # seeded random map
    assert (batch["segment_ids"] == 0).all()  # one document: every query sees every needle
    for r in range(batch["inputs"].shape[0]):
      tokens = np.append(batch["inputs"][r], batch["targets"][r, -1])
      assert code.BOS not in tokens[1:]  # documents joined by FILE_SEP
      queries = np.flatnonzero(tokens == code.QUERY)
      assert len(queries) == k
      code_part = bytes(tokens[:queries[0]][tokens[:queries[0]] < 256].astype(np.uint8))
      for q in queries:
        line = bytes(tokens[q + 1:q + 1 + code_needles.NEEDLE_LEN].astype(np.uint8))
        assert line.startswith(b"KEY_") and line in code_part  # the answer is in the code
        answer = slice(q + code_needles.PROMPT_LEN, q + code_needles.PROMPT_LEN + 4)
        assert (batch["near_mask"][r, answer] + batch["far_mask"][r, answer] == 1).all()
      assert (batch["near_mask"][r] + batch["far_mask"][r]).sum() == 4 * k
