"""Hugging Face Qwen3 <-> chunkformer: same logits, bit-exact round trip, bad input refused.

A tiny random Qwen3 (hidden 64, 2 layers, vocab 300, every weight random, norms included) built
and run by ``transformers`` (torch, CPU: test-only) is the reference implementation.
"""

import json
import os
import shutil

import chex
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from chunkformer import runtime as runtime_lib
from chunkformer import warm_start
from chunkformer.convert import hf_files, qwen3
from chunkformer.convert.hf_files import CheckpointError
from tests.hf_qwen3 import hf_logits, save_tiny_qwen3

SEQ_LEN = 64


@pytest.fixture(scope="module", params=[(True, 2), (False, 1)], ids=["tied-gqa", "untied-mqa"])
def imported(request, tmp_path_factory):
  """(HF model, HF dir, imported run dir) for tied embeddings + GQA and untied + MQA."""
  tied, kv_heads = request.param
  root = tmp_path_factory.mktemp("qwen3")
  hf_dir, run = str(root / "hf"), str(root / "run")
  model = save_tiny_qwen3(hf_dir, tied=tied, kv_heads=kv_heads)
  qwen3.import_checkpoint(hf_dir, run, seq_len=SEQ_LEN)
  return model, hf_dir, run


def _logits(run: str, tokens: np.ndarray) -> np.ndarray:
  config, _, params, _ = runtime_lib.restore_newest(run)
  rt = runtime_lib.build(config)
  with rt.context():
    return np.asarray(rt.model.apply({"params": params}, tokens))


def test_imported_logits_match_transformers(imported):
  model, _, run = imported
  tokens = np.random.default_rng(0).integers(0, 300, (2, SEQ_LEN))
  ours, ref = _logits(run, tokens), hf_logits(model, tokens)
  chex.assert_shape(ours, (2, SEQ_LEN, 300))
  np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)
  assert np.abs(ref).max() > 1.0  # logits of a random model are not trivially small


def test_imported_run_records_mapped_settings(imported):
  model, _, run = imported
  with open(os.path.join(run, "config.json")) as f:
    recorded = json.load(f)["model"]
  hf = model.config
  assert recorded["num_kv_heads"] == hf.num_key_value_heads
  assert recorded["tie_embeddings"] == hf.tie_word_embeddings
  assert recorded["norm_eps"] == hf.rms_norm_eps and recorded["rope_base"] == 5000.0
  assert recorded["scale_tied_logits"] is False and recorded["rope_fraction"] == 1.0
  assert qwen3.read_record(run)["hf_config"]["model_type"] == "qwen3"


def test_export_then_import_round_trips_bit_exactly(imported, tmp_path):
  import transformers

  model, hf_dir, run = imported
  exported, again = str(tmp_path / "exported"), str(tmp_path / "again")
  qwen3.export_checkpoint(run, exported)
  original, written = load_file(os.path.join(hf_dir, "model.safetensors")), load_file(
      os.path.join(exported, "model.safetensors"))
  assert set(written) == set(original)
  for name, value in original.items():
    np.testing.assert_array_equal(written[name], value, err_msg=name)
  qwen3.import_checkpoint(exported, again, seq_len=SEQ_LEN)
  _, _, first, _ = runtime_lib.restore_newest(run)
  _, _, second, _ = runtime_lib.restore_newest(again)
  chex.assert_trees_all_equal(first, second)
  # Other tools read the export: transformers loads it and computes identical logits.
  reloaded = transformers.Qwen3ForCausalLM.from_pretrained(exported).eval()
  tokens = np.random.default_rng(1).integers(0, 300, (1, 16))
  np.testing.assert_array_equal(hf_logits(reloaded, tokens), hf_logits(model, tokens))


def test_export_refuses_existing_files_and_compressed_layers(imported, tmp_path):
  _, hf_dir, run = imported
  with pytest.raises(CheckpointError, match="config.json exists"):
    qwen3.export_checkpoint(run, hf_dir)
  config = warm_start.workdir_lib.read_config(run)
  import dataclasses

  compressed = dataclasses.replace(config.model, layer_pattern="kind=fixed,window=8;")
  with pytest.raises(qwen3.ConfigError, match="model.attention.kind"):
    qwen3.exportable(compressed)
  with pytest.raises(qwen3.ConfigError, match="model.scan_layers"):
    qwen3.exportable(dataclasses.replace(config.model, scan_layers=True))


# ---- bad input: each refused before anything is written, naming the file or setting ----


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
  hf_dir = str(tmp_path_factory.mktemp("bad") / "hf")
  save_tiny_qwen3(hf_dir, tied=True, kv_heads=2, layers=1)
  return hf_dir


def _variant(tiny_hf, tmp_path, config_changes=None, tensors=None):
  bad = str(tmp_path / "bad_hf")
  shutil.copytree(tiny_hf, bad)
  if config_changes is not None:
    with open(os.path.join(bad, "config.json")) as f:
      config = json.load(f)
    config.update(config_changes)
    with open(os.path.join(bad, "config.json"), "w") as f:
      json.dump(config, f)
  if tensors is not None:
    path = os.path.join(bad, "model.safetensors")
    save_file(tensors(load_file(path)), path)
  return bad


def _refused(source, tmp_path, match):
  out = str(tmp_path / "run")
  with pytest.raises(CheckpointError, match=match):
    qwen3.import_checkpoint(source, out, seq_len=SEQ_LEN)
  assert not os.path.exists(out)


def test_directory_without_config_is_refused(tmp_path):
  os.makedirs(tmp_path / "empty")
  _refused(str(tmp_path / "empty"), tmp_path, "config.json: missing")


@pytest.mark.parametrize("changes, match", [
    ({"model_type": "qwen3_moe"}, "'model_type'"),
    ({"num_experts": 8}, "'num_experts'"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}},
     "rope_parameters.rope_type"),
    ({"attention_bias": True}, "'attention_bias'"),
    ({"use_sliding_window": True}, "'use_sliding_window'"),
    ({"hidden_act": "gelu"}, "'hidden_act'"),
    ({"layer_types": ["sliding_attention"]}, "'layer_types'"),
])
def test_unsupported_settings_are_refused_by_name(tiny_hf, tmp_path, changes, match):
  _refused(_variant(tiny_hf, tmp_path, config_changes=changes), tmp_path, match)


def test_missing_extra_and_misshapen_weights_are_refused(tiny_hf, tmp_path):
  name = "model.layers.0.mlp.up_proj.weight"
  for i, (edit, match) in enumerate([
      (lambda t: {k: v for k, v in t.items() if k != name}, f"missing weights \\['{name}'\\]"),
      (lambda t: dict(t, **{"model.layers.0.mlp.extra.weight": t[name]}),
       "model.safetensors: unexpected weights \\['model.layers.0.mlp.extra.weight'\\]"),
      (lambda t: dict(t, **{name: t[name][:-1]}), f"'{name}' has shape \\(95, 64\\)"),
  ]):
    case = tmp_path / str(i)
    os.makedirs(case)
    _refused(_variant(tiny_hf, case, tensors=edit), case, match)


def test_sharded_checkpoint_imports_like_the_single_file(tiny_hf, tmp_path):
  sharded = str(tmp_path / "sharded")
  os.makedirs(sharded)
  shutil.copy(os.path.join(tiny_hf, "config.json"), sharded)
  tensors = load_file(os.path.join(tiny_hf, "model.safetensors"))
  names = sorted(tensors)
  weight_map = {}
  for part, chunk in enumerate((names[: len(names) // 2], names[len(names) // 2:])):
    file = f"model-0000{part + 1}-of-00002.safetensors"
    save_file({k: tensors[k] for k in chunk}, os.path.join(sharded, file))
    weight_map.update({k: file for k in chunk})
  with open(os.path.join(sharded, hf_files.INDEX_FILE), "w") as f:
    json.dump({"weight_map": weight_map}, f)
  model = qwen3.model_config(hf_files.read_config(sharded))
  found = qwen3.check_weights(sharded, model)
  assert {os.path.basename(f) for f, _, _ in found.values()} == set(weight_map.values())
  params = qwen3.params_from_hf(model, hf_files.read_tensors(found))
  single = qwen3.params_from_hf(model, load_file(os.path.join(tiny_hf, "model.safetensors")))
  chex.assert_trees_all_equal(params, single)


def test_tokenizer_larger_than_the_vocabulary_is_refused(tiny_hf, tmp_path):
  import tokenizers

  bad = _variant(tiny_hf, tmp_path)
  vocab = {f"t{i}": i for i in range(400)}
  tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t0")).save(
      os.path.join(bad, "tokenizer.json"))
  _refused(bad, tmp_path, "tokenizer.json: 400 tokens exceed the model's vocab_size 300")


def test_command_line_reports_error_without_traceback(tmp_path, capsys):
  with pytest.raises(SystemExit, match="error: .*config.json: missing"):
    qwen3.main(["--input", str(tmp_path), "--output", str(tmp_path / "run")])


def test_bfloat16_checkpoint_imports_exactly_as_float32(tiny_hf, tmp_path):
  import ml_dtypes

  bf16 = str(tmp_path / "bf16")
  os.makedirs(bf16)
  shutil.copy(os.path.join(tiny_hf, "config.json"), bf16)
  tensors = load_file(os.path.join(tiny_hf, "model.safetensors"))
  save_file({k: v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()},
            os.path.join(bf16, "model.safetensors"))
  model = qwen3.model_config(hf_files.read_config(bf16))
  found = qwen3.check_weights(bf16, model)
  assert {dtype for _, dtype, _ in found.values()} == {"BF16"}
  params = qwen3.params_from_hf(model, hf_files.read_tensors(found))
  rounded = {k: v.astype(ml_dtypes.bfloat16).astype(np.float32) for k, v in tensors.items()}
  chex.assert_trees_all_equal(params, qwen3.params_from_hf(model, rounded))
