"""Sweeps on an imported model: kv rows in its tokenizer's tokens, phases in tokens, a report."""

import json
import os
import string

import jax
import numpy as np
import pytest
import tokenizers

from chunkformer import config as config_lib
from chunkformer import data as data_lib
from chunkformer import run_tokens
from chunkformer import runtime as runtime_lib
from chunkformer.config import ConfigError, DataConfig
from chunkformer.convert import qwen3
from chunkformer.data import kv
from chunkformer.evaluation.probes import loaded_model, needle_sweep
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.sweep import run as sweep
from configs import from_pretrained
from configs.sweeps import sweep_config as make_sweep
from configs.sweeps import variant
from tests.hf_qwen3 import save_tiny_qwen3

CHARS = ["\n", "?", " ", ".", ",", "-"] + list(string.ascii_letters + string.digits) + ["@", "#"]
ID_BASE = 100  # tokenizer ids far from the kv task's own ids (0..70)


def write_char_tokenizer(path: str) -> None:
  """A character-level BPE (no merges) whose ids start at ID_BASE, plus one two-char token."""
  vocab = {c: ID_BASE + i for i, c in enumerate(CHARS)}
  vocab["ab"] = ID_BASE + len(CHARS)
  tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[("a", "b")])).save(path)


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
  root = tmp_path_factory.mktemp("loaded")
  hf_dir = str(root / "hf")
  save_tiny_qwen3(hf_dir, tied=True, kv_heads=2)
  write_char_tokenizer(os.path.join(hf_dir, "tokenizer.json"))
  run = str(root / "imported")
  qwen3.import_checkpoint(hf_dir, run, seq_len=96)
  return run


def test_token_map_is_one_to_one_on_the_kv_alphabet(tmp_path):
  path = str(tmp_path / "tok.json")
  write_char_tokenizer(path)
  data = DataConfig()
  mapping = run_tokens.TokenMap.build(run_tokens.load_tokenizer(path),
                                        run_tokens.TokenStrings(), data, 300)
  ids = np.arange(1, kv.vocab_size(data))
  assert (mapping.to_model[ids] >= ID_BASE).all()
  assert len(set(mapping.to_model[ids].tolist())) == ids.size
  np.testing.assert_array_equal(mapping.to_kv[mapping.to_model[ids]], ids)
  assert mapping.to_model[kv.BOS] == ID_BASE + CHARS.index("\n")
  assert mapping.to_model[kv.QUERY] == ID_BASE + CHARS.index("?")


@pytest.mark.parametrize("strings, vocab, match", [
    (run_tokens.TokenStrings(query="ab?"), 300, "query = 'ab\\?' is 2 tokens"),
    (run_tokens.TokenStrings(query=" "), 300, "filler\\[0\\] are the same token"),
    (run_tokens.TokenStrings(), 120, "outside the model's vocabulary of 120"),
    (run_tokens.TokenStrings(symbols=("a", "b")), 300, "data.num_symbols"),
])
def test_bad_token_strings_are_refused_by_name(tmp_path, strings, vocab, match):
  path = str(tmp_path / "tok.json")
  write_char_tokenizer(path)
  with pytest.raises(ConfigError, match=match):
    run_tokens.TokenMap.build(run_tokens.load_tokenizer(path), strings, DataConfig(), vocab)


def test_mapped_predictor_feeds_model_ids_and_returns_kv_ids(tmp_path):
  path = str(tmp_path / "tok.json")
  write_char_tokenizer(path)
  mapping = run_tokens.TokenMap.build(run_tokens.load_tokenizer(path),
                                        run_tokens.TokenStrings(), DataConfig(), 300)
  seen = {}

  def echo(rows):  # a "model" that predicts its own input token
    seen.update(rows)
    return {"predictions": rows["inputs"]}

  rows = needle_sweep.build(DataConfig(seq_len=96), needle_sweep.NeedleSweepSpec(12, 2))[0].rows
  out = loaded_model.MappedPredictor(echo, mapping)(rows)
  assert (seen["inputs"] >= ID_BASE).all()
  np.testing.assert_array_equal(seen["positions"], rows["positions"])
  np.testing.assert_array_equal(out["predictions"], rows["inputs"])


def test_sweep_runs_on_an_imported_model_and_writes_its_report(imported, tmp_path):
  config = make_sweep({"qwen3": variant(checkpoint=imported)}, name="loaded", num_offsets=12,
                      num_haystacks=2, depths=(0.0,), prefix_prompts=2, prefix_max=8,
                      slot_gain_rows=0, eval_batch_size=8, num_resamples=20,
                      num_permutations=20)
  assert qwen3.read_record(imported)["tokenizer"] == "tokenizer.json"
  trained = trained_lib.load(imported)
  assert run_tokens.for_run(imported, trained.config) is not None  # rows in its token ids
  outcome = sweep.run(config, str(tmp_path / "sweep"), command="test")
  with open(outcome.results_path) as f:
    (record,) = json.load(f)["variants"]
  assert record["attention"] == "full" and record["trained_steps"] == 0
  assert len(record["accuracy_by_offset"]) == 12
  assert all(0.0 <= a <= 1.0 for a in record["accuracy_by_offset"])
  assert len(record["prefix_probe"]["offsets"]) == 9
  with open(outcome.report_path) as f:
    assert "| qwen3" in f.read()


def test_training_batches_of_a_run_from_a_tokenizer_model_are_mapped(imported):
  config = config_lib.from_dict(from_pretrained.get_config(imported).to_dict())
  rt = runtime_lib.build(config)
  assert config.data.task == "kv" and rt.token_map is not None
  raw = data_lib.make_batch(config.data, seed=config.seed, step=0, split="train")
  batch = jax.device_get(rt.batch("train", 0))
  np.testing.assert_array_equal(batch["inputs"], rt.token_map.to_model[raw["inputs"]])
  np.testing.assert_array_equal(batch["targets"], rt.token_map.to_model[raw["targets"]])
  np.testing.assert_array_equal(batch["loss_mask"], raw["loss_mask"])


def test_the_paper_protocol_probes_run_on_an_imported_model(imported):
  from chunkformer.data import lookup_task
  from chunkformer.evaluation.probes import lookup
  from chunkformer.evaluation.probes.base import ProbeContext
  from chunkformer.studies.paper.probes import head_knockout

  trained = trained_lib.load(imported)
  predict = loaded_model.adapt(trained, trained_lib.Predictor(trained, 32))
  context = ProbeContext(trained, predict, "qwen3", (4,))
  table = lookup.probe(context, modulus=4, paddings=("prefix",)).record["modes"]["prefix"]
  assert table["total"] == [16] * 4 and 0.0 <= table["mean"] <= 1.0
  # the knockout's own forward pass (kv rows mapped into the model's tokens) predicts what the
  # sweep's predictor does when nothing is knocked out
  spec = lookup.lookup_spec(context, "lookup", modulus=4, prompts_per_residue=0, num_records=0,
                            num_demos=8, padding="prefix", keys=None, values=None,
                            filler=None, bos="default")
  rows = lookup_task.generate(spec, 0).rows()
  knockout = head_knockout.Knockout(trained, 32)
  np.testing.assert_array_equal(knockout.predict(rows), predict(rows)["predictions"])
  record = head_knockout.probe(context, modulus=4, batch_size=32).record
  layers, kv_heads = trained.config.model.num_layers, trained.config.model.num_kv_heads
  assert [(h["layer"], h["kv_head"]) for h in record["heads"]] == [
      (layer, h) for layer in range(layers) for h in range(kv_heads)]
