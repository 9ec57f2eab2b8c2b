"""Logical-axis rules fitted to the model and mesh; batch checks (abstract meshes, no devices)."""

import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from chunkformer import config as config_lib
from chunkformer import sharding
from chunkformer.config import ConfigError
from chunkformer.model import Transformer
from configs import smoke

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _boxed_params(**model):
  c = smoke.get_config()
  c.model.update(model)
  config = config_lib.from_dict(c.to_dict()).model
  tokens = jnp.zeros((1, 8), jnp.int32)
  return jax.eval_shape(lambda: Transformer(config).init(jax.random.key(0), tokens))


def _mesh(data, fsdp, tensor, context=1):
  return AbstractMesh((data, fsdp, context, tensor), sharding.MESH_AXES)


def test_mesh_axis_that_cannot_split_a_dimension_is_dropped_only_for_that_logical_axis():
  params = _boxed_params(num_kv_heads=1)  # MQA: one KV head cannot split over tensor=2
  rules = sharding.fit_rules(params, _mesh(1, 2, 2), config_lib.DEFAULT_AXIS_RULES)
  table = dict(rules)
  assert table["kv_heads"] is None
  assert table["heads"] == table["mlp"] == table["vocab"] == "tensor"
  assert table["embed"] == "fsdp" and table["batch"] == ("data", "fsdp")
  qkv = nn.get_partition_spec(params)["params"]["block_0"]["attn"]["qkv"]
  assert nn.logical_to_mesh_axes(tuple(qkv["k"]["kernel"]), rules) == P("fsdp", None, None)
  assert nn.logical_to_mesh_axes(tuple(qkv["q"]["kernel"]), rules) == P("fsdp", "tensor", None)


def test_rules_survive_a_json_round_trip_and_unknown_mesh_axes_are_refused():
  as_json = [["batch", ["data", "fsdp"]], ["embed", "fsdp"], ["length", None]]
  assert sharding.normalize_rules(as_json) == (
      ("batch", ("data", "fsdp")), ("embed", "fsdp"), ("length", None))
  with pytest.raises(ConfigError, match="mesh.axis_rules"):
    sharding.normalize_rules([["embed", "model"]])


def test_batch_that_the_batch_axes_do_not_divide_is_refused():
  rules = sharding.normalize_rules(config_lib.DEFAULT_AXIS_RULES)
  batch = sharding.batch_sharding(_mesh(2, 2, 2), rules)
  sharding.check_batch(8, batch)
  with pytest.raises(ConfigError, match="data.batch_size"):
    sharding.check_batch(6, batch)


def test_mesh_that_does_not_match_the_devices_names_the_mesh():
  with pytest.raises(ConfigError, match="'mesh'"):
    sharding.make_mesh(config_lib.MeshConfig(data=2), devices=jax.devices()[:1])


def test_command_line_refuses_bad_config_naming_the_field(tmp_path):
  workdir = tmp_path / "run"
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "train.py"), "--config",
       os.path.join(ROOT, "configs", "smoke.py"), "--workdir", str(workdir),
       "--config.model.num_heads=3", "--config.model.num_kv_heads=1"],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
      timeout=120)
  assert result.returncode == 1
  assert "config field 'model.num_heads'" in result.stderr
  assert not workdir.exists()


def test_context_axis_splits_the_tokens_of_the_batch_and_the_activations():
  rules = sharding.normalize_rules(config_lib.DEFAULT_AXIS_RULES)
  batch = sharding.batch_sharding(_mesh(2, 1, 1, context=4), rules)
  assert batch.spec == P(("data", "fsdp"), "context")
  assert nn.logical_to_mesh_axes(("batch", "length", "act_embed"), rules) == P(
      ("data", "fsdp"), "context", None)
  assert config_lib.MeshConfig(data=-1, context=4).shape(8) == (2, 1, 4, 1)
  with pytest.raises(ConfigError, match="mesh.context"):
    config_lib.MeshConfig(context=0).shape(8)


def _context_config(fields):
  """The smoke config on mesh.context = 4 with ``fields`` (dotted names) overridden."""
  c = smoke.get_config()
  c.mesh.context = 4
  for key, value in fields.items():
    *sections, name = key.split(".")
    node = c
    for section in sections:
      node = node[section]
    node[name] = value
  return c.to_dict()


@pytest.mark.parametrize(("fields", "field"), [
    ({"data.seq_len": 30}, "'data.seq_len'"),  # 30 tokens do not split over 4 devices
    ({"model.attention.kind": "fixed", "model.attention.implementation": "pallas_gpu",
      "model.attention.interpret": True}, r"'model.attention\[layer 0\].implementation'"),
])
def test_context_axis_refuses_what_it_cannot_split_before_compiling(fields, field):
  with pytest.raises(ConfigError, match=field):
    config_lib.from_dict(_context_config(fields))
  config_lib.from_dict(_context_config({}))  # the smoke config itself splits over context = 4
