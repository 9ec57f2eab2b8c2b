"""Invariants of the offline data pipeline: determinism, process slicing, layouts, masks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from chunkformer import config as config_lib
from chunkformer import data
from chunkformer.config import ConfigError, DataConfig
from chunkformer.data import code, code_needles, kv

KV = DataConfig(batch_size=8)
KV_LONG = DataConfig(batch_size=8, seq_len=128, num_pairs=6, key_len=2, value_len=3,
                     num_queries=3, near_distance=40)
CODE = DataConfig(task="code", batch_size=8, seq_len=512)
NEEDLES = DataConfig(task="code", batch_size=8, seq_len=384, code_needles=3, near_distance=120)
ALL = {"kv": KV, "kv_long": KV_LONG, "code": CODE, "code_needles": NEEDLES}
CONTRACT_KEYS = {"inputs", "targets", "loss_mask", "positions", "segment_ids"}
RETRIEVAL_KEYS = CONTRACT_KEYS | {"near_mask", "far_mask"}


def _batch(cfg: DataConfig, step: int = 0, split: str = "train", seed: int = 0, **kwargs):
  return data.make_batch(cfg, seed=seed, step=step, split=split, **kwargs)


def _assert_batches_equal(a, b):
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def _needles_in_haystack(tokens: np.ndarray, cfg: DataConfig) -> dict[tuple, tuple]:
  """Reads the haystack of a rendered kv row: key -> (value, offset), by scanning symbol runs."""
  base = kv.symbol_base(cfg)
  stop = kv.query_start(cfg)
  is_symbol = np.concatenate([[False], tokens[1:stop] >= base, [False]])
  edges = np.flatnonzero(np.diff(is_symbol.astype(np.int8))) + 1  # first index after a change
  found = {}
  for start, end in zip(edges[::2], edges[1::2], strict=True):
    assert end - start == kv.needle_len(cfg), "symbol runs must be exactly one needle"
    key = tuple(tokens[start:start + cfg.key_len])
    assert key not in found, "keys must be unique within a row"
    found[key] = (tuple(tokens[start + cfg.key_len:end]), int(start))
  return found


@pytest.mark.parametrize("name", list(ALL))
def test_batch_has_contract_keys_shapes_and_dtypes(name):
  cfg = ALL[name]
  batch = _batch(cfg)
  expected = RETRIEVAL_KEYS if name != "code" else CONTRACT_KEYS
  assert set(batch) == expected
  for key, value in batch.items():
    assert value.shape == (cfg.batch_size, cfg.seq_len), key
    want = np.float32 if key.endswith("mask") else np.int32
    assert value.dtype == want, key
  assert batch["inputs"].max() < data.vocab_size_needed(cfg)
  assert batch["targets"].min() >= 0


@pytest.mark.parametrize("name", list(ALL))
def test_same_arguments_give_identical_batches_and_others_differ(name):
  cfg = ALL[name]
  first = _batch(cfg, step=3)
  _assert_batches_equal(first, _batch(cfg, step=3))
  for other in (_batch(cfg, step=4), _batch(cfg, step=3, seed=1),
                _batch(cfg, step=3, split="heldout")):
    assert not np.array_equal(first["inputs"], other["inputs"])
  # Rows within one batch are distinct draws too.
  assert len({row.tobytes() for row in first["inputs"]}) == cfg.batch_size


@pytest.mark.parametrize("name", list(ALL))
@pytest.mark.parametrize("process_count", [2, 4])
def test_process_slices_concatenate_to_the_global_batch(name, process_count):
  cfg = ALL[name]
  whole = _batch(cfg, step=7)
  parts = [_batch(cfg, step=7, process_index=p, process_count=process_count)
           for p in range(process_count)]
  _assert_batches_equal(whole, {k: np.concatenate([p[k] for p in parts]) for k in whole})


def test_bad_split_and_uneven_process_split_are_rejected_by_name():
  with pytest.raises(ValueError, match="'validation'"):
    _batch(KV, split="validation")
  with pytest.raises(ConfigError, match="data.batch_size"):
    _batch(KV, process_count=3)


@pytest.mark.parametrize("name", list(ALL))
def test_targets_are_inputs_shifted_by_one(name):
  batch = _batch(ALL[name], step=1)
  np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])


@pytest.mark.parametrize("name", ["kv", "kv_long"])
def test_kv_loss_is_only_on_answers_and_answers_are_the_haystack_values(name):
  cfg = ALL[name]
  batch = _batch(cfg, step=2)
  for b in range(cfg.batch_size):
    tokens = np.append(batch["inputs"][b], batch["targets"][b, -1])
    needles = _needles_in_haystack(tokens, cfg)
    assert len(needles) == cfg.num_pairs
    markers = np.flatnonzero(tokens == kv.QUERY)
    assert len(markers) == cfg.num_queries
    expected_mask = np.zeros(cfg.seq_len, np.float32)
    expected_near = np.zeros(cfg.seq_len, np.float32)
    for marker in markers:
      key = tuple(tokens[marker + 1:marker + 1 + cfg.key_len])
      value, offset = needles[key]
      answer = slice(marker + cfg.key_len, marker + cfg.key_len + cfg.value_len)
      assert tuple(batch["targets"][b, answer]) == value
      expected_mask[answer] = 1.0
      if marker - offset <= cfg.near_distance:
        expected_near[answer] = 1.0
    np.testing.assert_array_equal(batch["loss_mask"][b], expected_mask)
    np.testing.assert_array_equal(batch["near_mask"][b], expected_near)
    np.testing.assert_array_equal(batch["far_mask"][b], expected_mask - expected_near)
    np.testing.assert_array_equal(batch["positions"][b], np.arange(cfg.seq_len))
    assert not batch["segment_ids"][b].any()


def test_kv_rows_contain_both_near_and_far_answers():
  batch = _batch(dataclasses.replace(KV, batch_size=16))
  assert batch["near_mask"].sum() > 0 and batch["far_mask"].sum() > 0
  assert not (batch["near_mask"] * batch["far_mask"]).any()


def test_kv_pair_offsets_cover_every_phase_for_chunk_sizes_up_to_16():
  cfg = dataclasses.replace(KV, batch_size=16)
  batch = _batch(cfg, step=5)
  offsets = []
  for b in range(cfg.batch_size):
    tokens = np.append(batch["inputs"][b], batch["targets"][b, -1])
    offsets += [offset for _, offset in _needles_in_haystack(tokens, cfg).values()]
  offsets = np.array(offsets)
  for m in range(2, 17):
    assert set(offsets % m) == set(range(m)), f"chunk size {m}"


def test_default_config_is_a_valid_kv_task_with_a_small_vocabulary():
  full = config_lib.Config().validate()
  assert data.vocab_size_needed(full.data) == kv.vocab_size(full.data) <= 128
  assert data.vocab_size_needed(CODE) == code.VOCAB_SIZE


def test_config_validation_names_the_offending_field():
  cases = {
      "model.vocab_size": config_lib.Config(data=DataConfig(task="code")),
      "data.seq_len": config_lib.Config(data=DataConfig(seq_len=40)),
      "data.num_symbols": config_lib.Config(data=DataConfig(num_symbols=3, num_queries=1)),
      "data.code_needles": config_lib.Config(
          model=config_lib.ModelConfig(vocab_size=260),
          data=DataConfig(task="code", seq_len=64, code_needles=2)),
      "data.num_filler": config_lib.Config(data=DataConfig(num_filler=0)),
  }
  for field, cfg in cases.items():
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
      cfg.validate()


# ---------------------------------------------------------------- layout tools of the sweep


def _sweep_layouts(cfg: DataConfig, depth: float, num_offsets: int, seed: int = 0):
  start, stop = kv.sweep_window(cfg, num_offsets=num_offsets, depth=depth)
  base = kv.sample_layout(np.random.default_rng(seed), cfg, reserved=(start, stop),
                          num_queries=1)
  base = kv.with_queries(base, (2,))
  return start, stop, base, [kv.with_pair_at(base, 2, start + k) for k in range(num_offsets)]


def test_reserved_interval_and_its_margin_stay_free_of_needles():
  for seed in range(20):
    start, stop = 50, 90
    layout = kv.sample_layout(np.random.default_rng(seed), KV_LONG, reserved=(start, stop))
    for offset in layout.offsets:
      end = offset + layout.needle_len
      assert end < start or offset > stop


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_moving_one_pair_keeps_every_other_token_identical(depth):
  cfg = KV_LONG
  num_offsets = 36  # 3 * the largest chunk size tested (12)
  start, stop, base, layouts = _sweep_layouts(cfg, depth, num_offsets)
  tokens = np.stack([kv.render_tokens(layout) for layout in layouts])
  outside = np.ones(base.length, bool)
  outside[start:stop] = False
  assert (tokens[:, outside] == tokens[0, outside]).all()
  key, value = base.keys[2], base.values[2]
  filler = np.asarray(base.filler)
  for k, row in enumerate(tokens):
    needle = np.zeros(base.length, bool)
    needle[start + k:start + k + kv.needle_len(cfg)] = True
    assert tuple(row[needle]) == key + value
    assert (row[~needle & ~outside] == filler[~needle & ~outside]).all()
  offsets = np.arange(start, start + num_offsets)
  for m in range(2, 13):
    assert set(offsets % m) == set(range(m))


def test_sweep_depth_orders_needle_distance_and_rows_ask_the_moved_pair():
  distances = []
  for depth in (0.0, 0.5, 1.0):
    _, _, _, layouts = _sweep_layouts(KV_LONG, depth, 12)
    batch = kv.render_many(layouts, KV_LONG)
    spans = [kv.query_spans(layout)[0] for layout in layouts]
    for row, span, layout in zip(range(len(layouts)), spans, layouts, strict=True):
      assert span.pair == 2
      assert (batch["inputs"][row] == kv.QUERY).sum() == 1
      answer = batch["targets"][row, span.answer_start:span.answer_stop]
      assert tuple(answer) == layout.values[2]
      assert batch["loss_mask"][row].sum() == KV_LONG.value_len
    distances.append(spans[0].distance)
  assert distances[0] > distances[1] > distances[2] >= kv.needle_len(KV_LONG)


def test_with_pair_at_rejects_touching_or_escaping_needles():
  layout = kv.sample_layout(np.random.default_rng(0), KV_LONG)
  other = layout.offsets[1]
  for offset in (other, other + layout.needle_len, other - layout.needle_len, 0,
                 layout.query_start - layout.needle_len + 1):
    with pytest.raises(ValueError):
      kv.with_pair_at(layout, 0, offset)


# ---------------------------------------------------------------- code corpus


def test_code_segments_positions_and_loss_mask_are_consistent():
  # Long rows, so that some pack several files (a row starts inside one random file).
  batch = _batch(dataclasses.replace(CODE, batch_size=16, seq_len=1024), step=1)
  inputs, segments, positions = batch["inputs"], batch["segment_ids"], batch["positions"]
  starts = inputs == code.BOS
  assert starts[:, 0].all()
  np.testing.assert_array_equal(positions == 0, starts)
  np.testing.assert_array_equal(np.diff(segments, axis=1), starts[:, 1:].astype(np.int32))
  np.testing.assert_array_equal(np.diff(positions, axis=1)[~starts[:, 1:]], 1)
  assert (segments[:, 0] == 0).all() and segments.max() >= 1  # rows do pack several files
  # A target is scored iff it stays in its input's document (is not the next BOS).
  np.testing.assert_array_equal(batch["loss_mask"], (batch["targets"] != code.BOS))
  assert not np.isin(inputs, (code.PAD, code.QUERY, code.FILE_SEP)).any()


@pytest.mark.parametrize("split", data.SPLITS)
def test_code_documents_are_text_of_their_split_files(split):
  corpus = code.load_corpus(split, CODE.heldout_fraction)
  batch = _batch(CODE, split=split)
  for row in batch["inputs"]:
    for doc in np.split(row, np.flatnonzero(row == code.BOS)[1:]):
      text = doc[1:].astype(np.uint8).tobytes()
      assert corpus.data.find(text) >= 0


def test_train_heldout_file_split_is_disjoint_complete_and_stable():
  train = set(code.load_corpus("train", 0.1).paths)
  heldout = set(code.load_corpus("heldout", 0.1).paths)
  assert train and heldout and not train & heldout
  assert 0.04 < len(heldout) / (len(train) + len(heldout)) < 0.2
  assert all(p.endswith(".py") and "site-packages" not in p and "/test/" not in p for p in train)
  # Fixed expectations: the split depends on the path text alone, never on this process.
  for path, held in (("json/decoder.py", False), ("os.py", False), ("typing.py", False),
                     ("bz2.py", True), ("calendar.py", True), ("copyreg.py", True)):
    assert code.is_heldout(path, 0.1) is held, path
    assert path in (heldout if held else train) or path not in train | heldout
  assert set(code.load_corpus("heldout", 0.3).paths) >= heldout  # a larger cut only adds


def test_code_needle_answers_match_the_planted_lines():
  cfg = NEEDLES
  batch = _batch(cfg, step=2)
  assert not batch["segment_ids"].any()
  assert batch["near_mask"].sum() > 0 and batch["far_mask"].sum() > 0
  for b in range(cfg.batch_size):
    tokens = np.append(batch["inputs"][b], batch["targets"][b, -1])
    markers = np.flatnonzero(tokens == code.QUERY)
    assert len(markers) == cfg.code_needles
    query_start = markers[0]
    haystack = np.where(tokens[:query_start] < 256, tokens[:query_start], 0).astype(np.uint8)
    haystack = haystack.tobytes()
    expected_answer = np.zeros(cfg.seq_len, np.float32)
    expected_near = np.zeros(cfg.seq_len, np.float32)
    for marker in markers:
      line = tokens[marker + 1:marker + 1 + code_needles.NEEDLE_LEN].astype(np.uint8).tobytes()
      prompt = line[:code_needles.PROMPT_LEN]
      assert prompt.startswith(b"KEY_") and haystack.count(prompt) == 1
      offset = haystack.find(prompt)
      assert haystack[offset - 1] in (ord("\n"), 0)  # planted at a line start
      answer = slice(marker + code_needles.PROMPT_LEN,
                     marker + code_needles.PROMPT_LEN + code_needles.VALUE_SYMBOLS)
      planted = haystack[offset + code_needles.PROMPT_LEN:offset + len(line) - 2]
      assert batch["targets"][b, answer].astype(np.uint8).tobytes() == planted
      expected_answer[answer] = 1.0
      if marker - offset <= cfg.near_distance:
        expected_near[answer] = 1.0
    code_targets = (np.arange(cfg.seq_len) < query_start - 1).astype(np.float32)
    np.testing.assert_array_equal(batch["loss_mask"][b], code_targets + expected_answer)
    np.testing.assert_array_equal(batch["near_mask"][b], expected_near)
    np.testing.assert_array_equal(batch["far_mask"][b], expected_answer - expected_near)
