"""The training loop: resume equals an uninterrupted run, bad input fails early, NaN stops.

In-process on one CPU device with the smoke config (a ~20k-parameter model); the multi-device
and multi-process checks live in test_parallel.py, kill -9 in test_kill_resume.py.
"""

import dataclasses
import glob
import json
import logging
import os
import shutil
import signal
from unittest import mock

import chex
import jax
import orbax.checkpoint as ocp
import pytest

from chunkformer import checkpointing, heldout, trainer
from chunkformer import config as config_lib
from chunkformer import runtime as runtime_lib
from chunkformer import workdir as workdir_lib
from chunkformer.config import ConfigError
from configs import smoke


def smoke_config(**overrides) -> config_lib.Config:
  """The smoke config with dotted overrides, e.g. smoke_config(**{"train.steps": 3})."""
  c = smoke.get_config()
  for dotted, value in overrides.items():
    node = c
    *path, leaf = dotted.split(".")
    for key in path:
      node = node[key]
    node[leaf] = value
  return config_lib.from_dict(c.to_dict())


RESUME = {"train.steps": 3, "train.checkpoint_every": 1, "train.log_every": 1,
          "train.eval_every": 100, "train.keep_checkpoints": 3}


def final_params(config: config_lib.Config, workdir: str):
  rt = runtime_lib.build(config)
  checkpointer = checkpointing.Checkpointer(workdir, config.train, read_only=True)
  state, step = checkpointer.restore_latest(rt.abstract_state)
  checkpointer.close()
  assert step == config.train.steps
  return state.params


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("uninterrupted"))
  config = smoke_config(**RESUME)
  return config, workdir, trainer.train(config, workdir)


def test_preempted_run_resumes_at_next_step_with_identical_parameters(uninterrupted, tmp_path,
                                                                      caplog):
  config, reference_dir, reference = uninterrupted
  workdir = str(tmp_path)

  def sigterm_after_step_1(p: trainer.Progress) -> None:
    if p.split == "train" and p.step == 1:
      os.kill(os.getpid(), signal.SIGTERM)

  # One update, its checkpoint (checkpoint_every=1), then SIGTERM: the run stops at step 1.
  assert trainer.train(config, workdir, progress=sigterm_after_step_1) == {
      "step": 1, "preempted": True}
  logged = []
  resumed = trainer.train(config, workdir, progress=lambda p: logged.append((p.split, p.step)))
  assert logged == [("train", 2), ("train", 3), ("heldout", 3)]  # continued at step 1
  assert resumed == reference
  chex.assert_trees_all_equal(final_params(config, workdir), final_params(config, reference_dir))



def test_unrestorable_latest_checkpoint_is_reported_and_the_previous_one_restores(
    uninterrupted, tmp_path, caplog):
  config, reference_dir, _ = uninterrupted
  shutil.copytree(os.path.join(reference_dir, "checkpoints"), tmp_path / "checkpoints")
  for path in glob.glob(str(tmp_path / "checkpoints" / "3" / "default" / "*")):
    if os.path.isfile(path):
      with open(path, "wb") as f:
        f.write(b"garbage")
  abstract = runtime_lib.build(config).abstract_state
  checkpointer = checkpointing.Checkpointer(str(tmp_path), config.train)
  with caplog.at_level(logging.ERROR):
    state, step = checkpointer.restore_latest(abstract)
  assert step == 2
  assert any("failed to restore" in r.getMessage() and "at step 3" in r.getMessage()
             and str(tmp_path / "checkpoints") in r.getMessage() for r in caplog.records)
  assert checkpointer.steps() == [1, 2]  # step 3 can be saved again by the resumed run
  assert glob.glob(str(tmp_path / "broken_checkpoints" / "3-*"))
  checkpointer.close()
  reference = checkpointing.Checkpointer(reference_dir, config.train, read_only=True)
  expected = reference.manager.restore(2, args=ocp.args.StandardRestore(abstract))
  reference.close()
  chex.assert_trees_all_equal(state, expected)


def test_evaluate_checkpoint_reproduces_final_metrics(uninterrupted, tmp_path):
  _, workdir, reference = uninterrupted
  result = heldout.evaluate_checkpoint(workdir)
  assert result["step"] == 3 and result["finished"]
  assert result["heldout"] == reference["heldout"]
  with open(os.path.join(workdir, workdir_lib.FINAL_METRICS_FILE)) as f:
    assert json.load(f) == reference
  with pytest.raises(ConfigError, match=str(tmp_path)):
    heldout.evaluate_checkpoint(str(tmp_path))


def test_only_one_event_file_and_the_config_are_written(uninterrupted):
  config, workdir, _ = uninterrupted
  assert len(glob.glob(os.path.join(workdir, "events.out.tfevents.*"))) == 1
  assert workdir_lib.read_config(workdir) == config


@pytest.mark.parametrize("overrides, field", [
    ({"model.num_heads": 3, "model.num_kv_heads": 1}, "model.num_heads"),  # 3 !| d_model 32
    ({"model.attention.kind": "sparse"}, r"model.attention\[layer 0\].kind"),
    ({"train.steps": -1}, "train.steps"),
    ({"model.vocab_size": 16}, "model.vocab_size"),  # the kv task emits 23 ids
])
def test_bad_config_is_refused_at_validation_naming_the_field(overrides, field):
  with pytest.raises(ConfigError, match=field):
    smoke_config(**overrides)


def _no_compiling(*args, **kwargs):
  raise AssertionError("compiled before the bad input was reported")


@pytest.mark.parametrize("overrides, field", [
    ({"mesh.data": 2}, "'mesh'"),  # 2 x 1 x 1 devices wanted, 1 present
    ({"mesh.tensor": 2}, "'mesh'"),
])
def test_mesh_that_does_not_match_devices_fails_before_compiling(overrides, field, tmp_path):
  with mock.patch.object(jax, "jit", _no_compiling), pytest.raises(ConfigError, match=field):
    trainer.train(smoke_config(**overrides), str(tmp_path))
  assert not os.listdir(tmp_path)  # nothing written either


def test_workdir_of_another_run_is_refused_before_compiling(tmp_path):
  workdir = str(tmp_path)
  workdir_lib.prepare(workdir, smoke_config())
  with mock.patch.object(jax, "jit", _no_compiling):
    with pytest.raises(ConfigError, match=r"model.d_model: 32 -> 64(.|\n)*--overwrite"):
      trainer.train(smoke_config(**{"model.d_model": 64}), workdir)


def test_overwrite_moves_the_old_run_aside_and_bookkeeping_changes_are_allowed(tmp_path):
  workdir = str(tmp_path)
  workdir_lib.prepare(workdir, smoke_config())
  os.makedirs(os.path.join(workdir, "checkpoints", "2"))
  workdir_lib.prepare(workdir, smoke_config(**{"train.log_every": 1}))  # same run
  assert workdir_lib.read_config(workdir).train.log_every == 1
  workdir_lib.prepare(workdir, smoke_config(**{"seed": 7}), overwrite=True)
  (replaced,) = glob.glob(os.path.join(workdir, "replaced-*"))
  assert os.path.isdir(os.path.join(replaced, "checkpoints", "2"))
  assert workdir_lib.read_config(replaced).seed == 0
  assert workdir_lib.read_config(workdir).seed == 7
  assert not os.path.exists(os.path.join(workdir, "checkpoints"))


def test_non_finite_loss_stops_the_run_naming_the_step(tmp_path):
  # A huge learning rate overflows the parameters after the first update: step 1's gradient
  # is NaN. The state after it must not be checkpointed.
  config = smoke_config(**{"train.learning_rate": 1e30, "train.warmup_steps": 0,
                           "train.checkpoint_every": 1})
  with pytest.raises(FloatingPointError, match="at step 1 "):
    trainer.train(config, str(tmp_path))
  assert sorted(os.listdir(os.path.join(tmp_path, "checkpoints"))) == ["1"]


def _drop_field(tree: dict, dotted: str) -> None:
  *path, leaf = dotted.split(".")
  for key in path:
    tree = tree[key]
  del tree[leaf]


# The config.json of the first study's fixed_m4 run (results/study at 227642e), as the code of
# 2026-11-30 wrote it: before model.attention.derotate and other fields existed.
PRE_DEROTATION_RECORD = os.path.join(os.path.dirname(__file__), "data",
                                     "pre_derotation_fixed_m4_config.json")


def test_run_recorded_before_a_field_existed_is_the_same_run(tmp_path):
  # A run directory as the previous code wrote it, with one field removed to stand
  # for a field added since (with its default): accepted as the same run, not moved aside.
  with open(PRE_DEROTATION_RECORD) as f:
    recorded = json.load(f)
  config = config_lib.from_dict(workdir_lib.upgrade_record(recorded))  # as the run was made
  _drop_field(recorded, "model.attention.interpret")
  with open(tmp_path / workdir_lib.CONFIG_FILE, "w") as f:
    json.dump(recorded, f)
  workdir_lib.prepare(str(tmp_path), config)
  assert not glob.glob(os.path.join(tmp_path, "replaced-*"))
  # A field whose recorded value is not today's default still names itself.
  recorded["model"]["attention"]["interpret"] = True
  with open(tmp_path / workdir_lib.CONFIG_FILE, "w") as f:
    json.dump(recorded, f)
  with pytest.raises(ConfigError, match=r"model.attention.interpret: True -> False"):
    workdir_lib.prepare(str(tmp_path), config)


def test_run_recorded_before_value_derotation_reads_back_without_it(tmp_path):
  # The first study ran before de-rotation existed: reading its record must give the
  # behaviour it was trained with, and today's default (de-rotation on) is a different run.
  shutil.copy(PRE_DEROTATION_RECORD, tmp_path / workdir_lib.CONFIG_FILE)
  recorded = workdir_lib.read_config(str(tmp_path))
  assert recorded.model.attention.derotate is False
  workdir_lib.prepare(str(tmp_path), recorded)  # the same run
  with pytest.raises(ConfigError, match=r"model.attention.derotate: False -> True"):
    workdir_lib.prepare(str(tmp_path), dataclasses.replace(
        recorded, model=dataclasses.replace(recorded.model, attention=dataclasses.replace(
            recorded.model.attention, derotate=True))))
