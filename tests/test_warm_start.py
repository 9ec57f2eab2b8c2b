"""Continued training of an imported Qwen3 with compressed attention (init.from_workdir).

A tiny random Qwen3 is imported, layer 0 becomes a fixed-chunk (M=4) compressed layer, and the
run trains a few steps on the byte-level code corpus: the loaded weights stay bit-identical
while only the new ones train, the loss falls, and a resumed run ends where the uninterrupted
one did.
"""

import dataclasses
import os
import shutil

import chex
import jax
import numpy as np
import pytest
from flax import traverse_util

from chunkformer import config as config_lib
from chunkformer import runtime as runtime_lib
from chunkformer import trainer, warm_start
from chunkformer import workdir as workdir_lib
from chunkformer.config import ConfigError
from chunkformer.convert import qwen3
from chunkformer.evaluation.probes import trained as trained_lib
from configs import from_pretrained
from tests.checkpoint_params import params_at
from tests.hf_qwen3 import save_tiny_qwen3

FREEZE = 4


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  root = tmp_path_factory.mktemp("warm")
  save_tiny_qwen3(str(root / "hf"), tied=True, kv_heads=2)
  qwen3.import_checkpoint(str(root / "hf"), str(root / "imported"), seq_len=64)
  return str(root / "imported")


def continued_config(source: str, **model_changes) -> config_lib.Config:
  """configs/from_pretrained.py with layer 0 compressed (fixed M=4, W=8), 8 short steps."""
  base = from_pretrained.get_config(source).to_dict()
  base["model"]["layer_pattern"] = "kind=fixed,chunk_size=4,window=8;"
  base["model"].update(model_changes)
  base["data"].update(task="code", batch_size=4)
  base["train"].update(steps=8, learning_rate=3e-3, warmup_steps=0, log_every=1, eval_every=100,
                       eval_batches=1, checkpoint_every=FREEZE, keep_checkpoints=3)
  base["init"]["train_only_new_steps"] = FREEZE
  return config_lib.from_dict(base)


@pytest.fixture(scope="module")
def continued(source, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("continued") / "run")
  config = continued_config(source)
  losses = []
  trainer.train(config, workdir, progress=lambda p: p.split == "train" and losses.append(
      p.metrics["loss"]))
  return config, workdir, losses


def test_new_parameters_are_exactly_the_compressor_of_layer_0(source):
  plan = warm_start.plan(continued_config(source))
  assert plan.new and all(p[:3] == ("block_0", "attn", "compressor") for p in plan.new)
  assert ("block_0", "attn", "qkv", "q", "kernel") in plan.loaded
  assert ("embedding",) in plan.loaded


def test_continued_training_loss_is_finite_and_falls(continued):
  _, _, losses = continued
  assert len(losses) == 8 and np.all(np.isfinite(losses))
  assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.05, losses


def test_loaded_weights_frozen_while_only_new_ones_train(continued, source):
  config, workdir, _ = continued
  _, _, original, _ = runtime_lib.restore_newest(source)
  plan = warm_start.plan(config)
  frozen = traverse_util.flatten_dict(params_at(workdir, config, FREEZE))
  final = traverse_util.flatten_dict(params_at(workdir, config, config.train.steps))
  original = traverse_util.flatten_dict(original)
  for path in plan.loaded:
    np.testing.assert_array_equal(frozen[path], original[path], err_msg="/".join(path))
  assert any(not np.array_equal(final[p], original[p]) for p in plan.loaded)
  fresh = traverse_util.flatten_dict(jax.device_get(_fresh_new_params(config)))
  assert all(not np.array_equal(frozen[p], fresh[p]) for p in plan.new)


def _fresh_new_params(config):
  """The same model's fresh initialisation (the warm start keeps it for the new weights)."""
  return runtime_lib.build(config).fresh_state().params


def test_resumed_continued_run_ends_with_identical_parameters(continued, tmp_path):
  config, workdir, _ = continued
  resumed = str(tmp_path / "resumed")
  shutil.copytree(workdir, resumed)
  shutil.rmtree(os.path.join(resumed, "checkpoints", str(config.train.steps)))
  os.remove(os.path.join(resumed, workdir_lib.FINAL_METRICS_FILE))
  trainer.train(config, resumed)
  chex.assert_trees_all_equal(params_at(resumed, config, config.train.steps),
                              params_at(workdir, config, config.train.steps))
  assert trained_lib.load(resumed).step == config.train.steps


@pytest.mark.parametrize("changes, match", [
    ({"rope_base": 10000.0}, "'model.rope_base'"),
    ({"qk_norm": False}, "'model.qk_norm'"),
])
def test_model_setting_differing_from_source_is_refused(source, tmp_path, changes, match):
  config = continued_config(source, **changes)
  with pytest.raises(ConfigError, match=match):
    trainer.train(config, str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run")


def test_dropping_source_weights_is_refused_naming_the_path(continued, tmp_path):
  _, workdir, _ = continued
  base = config_lib.to_dict(workdir_lib.read_config(workdir))
  base["model"]["layer_pattern"] = ""
  base["init"] = {"from_workdir": workdir, "train_only_new_steps": 0}
  with pytest.raises(ConfigError, match="block_0/attn/compressor/.* would be dropped"):
    warm_start.plan(config_lib.from_dict(base))


def test_missing_source_is_refused(tmp_path, source):
  config = continued_config(source)
  config = dataclasses.replace(config, init=config_lib.InitConfig(str(tmp_path / "nothing")))
  with pytest.raises(ConfigError, match="init.from_workdir.*config.json missing"):
    trainer.train(config, str(tmp_path / "run"))
