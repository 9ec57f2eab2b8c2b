"""Lookup and needle vocabularies of real words: the single-token words of a tokenizer built
by hand (``tests/word_bpe.py``: the words it holds are known), and the paper's probes run with
them on an imported tiny Qwen3 checkpoint, rows fed in the model's own ids."""

from __future__ import annotations

import os
import types

import numpy as np
import pytest

from chunkformer import run_tokens
from chunkformer.config import ConfigError, DataConfig
from chunkformer.convert import qwen3
from chunkformer.data import lookup_task, word_tokens
from chunkformer.data import tokenizer as tokenizer_lib
from chunkformer.evaluation.probes import (
  loaded_model,
  lookup,
)
from chunkformer.evaluation.probes import registry as probe_registry
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.probes.base import ProbeContext
from chunkformer.studies.paper.probes import gate_concentration, gate_cycling, head_knockout
from tests import word_bpe
from tests.hf_qwen3 import save_tiny_qwen3


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  return tokenizer_lib.load(word_bpe.save(str(tmp_path_factory.mktemp("tok") / "tok.json")))


def _text(tok, ids):
  return [tok.decode([i]) for i in ids]


def test_only_whole_words_that_encode_back_to_one_token_are_chosen(tok):
  ids = word_tokens.single_token_words(tok, 1000)
  assert _text(tok, ids) == [" " + w for w in word_bpe.WORDS]  # no zebra, 42, x, "cat"
  assert all(tok.encode(tok.decode([i])) == [i] for i in ids)
  assert tok.backend.token_to_id("Ġzebra") not in ids
  # ids the model's embedding does not have are never chosen
  cut = ids[10]
  assert word_tokens.single_token_words(tok, cut) == ids[:10]
  assert word_tokens.single_token_words(tokenizer_lib.byte_tokenizer(), 260) == []


def test_keys_and_values_are_disjoint_words_fixed_by_the_seed(tok):
  words = set(word_tokens.single_token_words(tok, 1000))
  chosen = word_tokens.choose(tok, 1000, seed=3, num_keys=5, num_values=7)
  assert len(chosen.keys) == 5 and len(chosen.values) == 7
  assert not set(chosen.keys) & set(chosen.values)
  assert set(chosen.keys) | set(chosen.values) <= words
  assert chosen == word_tokens.choose(tok, 1000, seed=3, num_keys=5, num_values=7)
  assert chosen != word_tokens.choose(tok, 1000, seed=4, num_keys=5, num_values=7)
  assert tok.decode([chosen.filler]) == "\n" and chosen.bos == 0 == tok.bos_id
  halves = word_tokens.choose(tok, 1000)  # no counts: every word, split in halves
  assert len(halves.keys) == len(halves.values) == 12
  assert set(halves.keys) | set(halves.values) == words
  same = word_tokens.choose(tok, 1000, num_keys=4)
  assert len(same.keys) == len(same.values) == 4
  # the spec built from them is a valid lookup task
  lookup_task.LookupSpec(seq_len=64, modulus=4, num_records=4, num_demos=2,
                         prompts_per_residue=16, **chosen.as_dict()).validate()


def test_too_few_words_or_no_tokenizer_is_an_error_naming_the_field(tok, tmp_path):
  with pytest.raises(ValueError, match=r"num_keys: 20 keys and 20 values need 40 single-token "
                                       r"words; tokenizer 'tok.json' has 24"):
    word_tokens.choose(tok, 1000, num_keys=20, num_values=20)
  with pytest.raises(ValueError, match="tokenizer 'bytes' has 0"):
    word_tokens.choose(tokenizer_lib.byte_tokenizer(), 260)
  data = DataConfig(seq_len=96, num_pairs=4, key_len=1, value_len=1, num_queries=1)
  trained = types.SimpleNamespace(
      workdir=str(tmp_path), config=types.SimpleNamespace(
          data=data, init=types.SimpleNamespace(from_workdir=""),
          model=types.SimpleNamespace(vocab_size=100)))
  context = ProbeContext(trained, None, "unit", (4,))
  with pytest.raises(ConfigError, match=r"'sweep\.probes\.lookup': vocabulary: 'words' needs a "
                                        r"model that speaks a tokenizer"):
    lookup.probe(context, modulus=4, vocabulary="words")
  with pytest.raises(ConfigError, match=r"'sweep\.probes\.long_needle': vocabulary: 'text' is "
                                        r"not one of task, words"):
    lookup.needle_probe(context, vocabulary="text")
  with pytest.raises(ConfigError, match=r"'sweep\.probes\.head_knockout': word_seed, num_keys"):
    probe_registry.check({"head_knockout": {"num_keys": 8}})
  probe_registry.check({"gate_cycling": {"vocabulary": "words", "word_seed": 2}})


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
  """A tiny random Qwen3 (vocabulary 384, full attention) imported with the word tokenizer."""
  root = tmp_path_factory.mktemp("words")
  hf_dir = str(root / "hf")
  save_tiny_qwen3(hf_dir, tied=True, kv_heads=2, vocab=384)
  word_bpe.save(os.path.join(hf_dir, "tokenizer.json"))
  run = str(root / "imported")
  qwen3.import_checkpoint(hf_dir, run, seq_len=96)
  return trained_lib.load(run)


def test_the_paper_probes_run_on_an_imported_model_in_its_own_words(imported, tok):
  trained = imported
  seen = []
  base = trained_lib.Predictor(trained, 32)

  def spy(rows):
    seen.append(np.asarray(rows["inputs"]))
    return base(rows)

  # the sweep's predictor maps kv rows into the model's tokens; words bypass that map
  mapping = run_tokens.for_run(trained.workdir, trained.config)
  assert mapping is not None
  context = ProbeContext(trained, loaded_model.MappedPredictor(spy, mapping), "qwen3", (4,))
  words = dict(vocabulary="words", word_seed=5, num_keys=8, num_values=8)
  chosen = word_tokens.choose(tok, 384, seed=5, num_keys=8, num_values=8)
  result = probe_registry.PROBES["lookup"](context, modulus=4, **words)
  test = lookup.ResidueTest.from_record(result.record)
  assert test.settings == {"num_records": 8, "num_demos": 7, "seed": 2609, "positions": "moments",
                           "distinct_values": False, "vocabulary": "words",
                           "word_seed": 5, "num_keys": 8, "num_values": 8,
                           "filler": chosen.filler, "bos": 0}
  for padding in ("prefix", "in_sequence"):
    table = test.modes[padding]
    assert table.total == (16,) * 4 and 0.0 <= table.mean <= 1.0
    assert result.matrices[padding].correct_YxJ.shape == (16, 4)
  allowed = set(chosen.keys) | set(chosen.values) | {chosen.filler, 0}
  assert len(seen) == 2 and all(set(np.unique(x).tolist()) <= allowed for x in seen)
  assert all(set(chosen.keys) & set(np.unique(x).tolist()) for x in seen)
  # the same predictions the model gives those rows directly (nothing mapped back)
  spec = lookup.lookup_spec(context, "lookup", modulus=4, prompts_per_residue=0, num_records=0,
                            num_demos=8, padding="prefix", keys=None, values=None, filler=None,
                            bos="default", **words)
  prompts = lookup_task.generate(spec, 2609)
  right = prompts.correct(base(prompts.rows())["predictions"])
  np.testing.assert_array_equal(right.reshape(4, -1).mean(axis=1),
                                test.modes["prefix"].accuracy)

  needle = lookup.needle_probe(context, modulus=4, **words).record
  assert needle["settings"]["vocabulary"] == "words"
  assert needle["modes"]["needle"]["total"] == [16] * 4
  assert set(np.unique(seen[-1]).tolist()) <= allowed
  # the knockout's own forward pass takes the words unmapped too: its clean run is the model's
  record = head_knockout.probe(context, modulus=4, **words).record
  assert [(h["layer"], h["kv_head"]) for h in record["heads"]] == [
      (layer, h) for layer in range(2) for h in range(2)]
  prompts = lookup_task.generate(spec, 31)  # the probe's default seed
  right = prompts.correct(base(prompts.rows())["predictions"])
  np.testing.assert_array_equal(right.reshape(4, -1).mean(axis=1), record["clean"])
  # full attention has no gates: nothing to cycle, no gate to measure
  assert gate_cycling.probe(context, deltas=(1,), **words).record is None
  concentration = gate_concentration.probe(context, rows=4, batch_size=4)
  assert concentration.record["gates"] == [] and concentration.figures == []


def test_the_words_sweep_config_sets_the_vocabulary_of_the_lookup_task_probes():
  from chunkformer.evaluation.sweep.config import settings_from
  from configs.sweeps import paper_protocol, paper_words

  settings = settings_from(paper_words.get_config("runs/qwen3"))  # the registry's checks
  assert set(settings.probes) == set(settings_from(paper_protocol.get_config("runs/q")).probes)
  for name in ("lookup", "long_needle", "gate_cycling", "head_knockout"):
    assert settings.probes[name]["vocabulary"] == "words"
    assert settings.probes[name]["num_keys"] == 0  # present, so the command line can set it
  assert "vocabulary" not in settings.probes["gate_concentration"]
  with pytest.raises(ValueError, match="name run directories"):
    paper_words.get_config()


def test_a_corpus_model_speaks_its_shards_tokenizer_a_plain_kv_run_none(tok, tmp_path):
  from chunkformer.data import ingest

  texts = tmp_path / "texts"
  texts.mkdir()
  for i in range(4):
    (texts / f"{i}.txt").write_text(" ".join(word_bpe.WORDS[i::4]) + "\n")
  shards = str(tmp_path / "shards")
  ingest.ingest(str(texts / "*.txt"), word_bpe.save(str(tmp_path / "tok.json")), shards,
                heldout_fraction=0.25, progress=False)
  data = types.SimpleNamespace(task="corpus", path=shards, tokenizer="", heldout_fraction=0.25)
  found = run_tokens.model_tokenizer("-", types.SimpleNamespace(data=data))
  assert found.hash == tok.hash
  assert word_tokens.single_token_words(found, 1000) == word_tokens.single_token_words(tok, 1000)
  kv = types.SimpleNamespace(data=types.SimpleNamespace(task="kv"),
                             init=types.SimpleNamespace(from_workdir=""))
  assert run_tokens.model_tokenizer(str(tmp_path), kv) is None  # no pretrained.json


def test_curated_words_are_keys_or_values_and_the_rest_is_drawn_from_the_others(imported, tok):
  context = ProbeContext(imported, None, "qwen3", (4,))
  ids = {w: tok.encode(" " + w)[0] for w in word_bpe.WORDS}
  animals = ("cat", "dog", " owl", "elk", "bee", "cow")  # a leading space is added if missing
  spec = lookup.lookup_spec(context, "lookup", modulus=4, prompts_per_residue=0, num_records=0,
                            num_demos=8, padding="prefix", keys=animals, values=None,
                            filler=None, bos="default", vocabulary="words", num_values=18)
  # only the values are drawn: all 18 words that are not given keys
  assert spec.keys == tuple(ids[w.strip()] for w in animals) and len(spec.values) == 18
  assert not set(spec.values) & set(spec.keys) and set(spec.values) <= set(ids.values())
  names = ("Ann", "Bob", "Cy")
  both = lookup.lookup_spec(context, "lookup", modulus=4, prompts_per_residue=0, num_records=0,
                            num_demos=8, padding="prefix", keys=animals, values=names,
                            filler=None, bos=None, vocabulary="words")
  assert both.values == tuple(ids[w] for w in names) and both.bos is None
  assert tok.decode([both.filler]) == "\n"
  with pytest.raises(ConfigError, match=r"'sweep\.probes\.lookup': keys: ' zebra' is not one "
                                        r"token of tokenizer 'tokenizer.json'"):
    lookup.lookup_spec(context, "lookup", modulus=4, prompts_per_residue=0, num_records=0,
                       num_demos=8, padding="prefix", keys=("cat", "zebra"), values=names,
                       filler=None, bos="default", vocabulary="words")
  with pytest.raises(ConfigError, match=r"'sweep\.probes\.lookup': keys: words .* need "
                                        r"vocabulary = 'words'"):
    lookup.lookup_spec(context, "lookup", modulus=4, prompts_per_residue=0, num_records=0,
                       num_demos=8, padding="prefix", keys=animals, values=(1, 2), filler=3,
                       bos="default")
