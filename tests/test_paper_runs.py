"""configs/paper/run.py: one config for every run of the study's pretraining sweep, chosen by
its argument (run and size)."""

import glob
import importlib.util
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from chunkformer import config as config_lib
from chunkformer import objective, train_state
from chunkformer.evaluation.records.variant import VariantSetup
from chunkformer.evaluation.sweep import config as sweep_config
from chunkformer.evaluation.sweep import unit
from chunkformer.evaluation.sweep.config import flatten
from chunkformer.model import Transformer
from configs.paper import runs

PAPER_DIR = os.path.join(os.path.dirname(__file__), os.pardir, "configs", "paper")


def _config(run, size):
  return config_lib.from_dict(runs.get_run_config(run, size).to_dict())


def _load_file(path, arg=None):
  spec = importlib.util.spec_from_file_location("paper_run", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config() if arg is None else module.get_config(arg)


# Every run of the paper's table by name: the configs/paper/<run>.py files these replaced.
PAPER_RUNS = (
    "full_1kv", "full_4kv", "full_8kv", "w12s12_1kv", "w4s4_1kv", "w8s4_1kv",
    "w8s4_dsv4_kernel", "w8s4_dsv4_kernel_scalar", "w8s6_1kv", "w8s8_1kv",
    "w8s8_1kv_no_gate_bias", "w8s8_1kv_no_qk_norm", "w8s8_1kv_nope", "w8s8_1kv_rope16",
    "w8s8_1kv_tail", "w8s8_1kv_tied_kv", "w8s8_1kv_uniform",
    "w8s8_1kv_uniform_tied_kv_post_norm", "w8s8_1kv_vector", "w8s8_2kv", "w8s8_4kv",
    "w8s8_8kv", "w8s8_8kv_tail")


def test_every_paper_run_name_resolves_through_the_one_config_at_each_size():
  assert set(runs.RUNS) == set(PAPER_RUNS)
  path = os.path.join(PAPER_DIR, "run.py")
  assert {os.path.basename(p) for p in glob.glob(os.path.join(PAPER_DIR, "*.py"))} == {
      "__init__.py", "runs.py", "run.py"}
  for run in PAPER_RUNS:
    assert runs.source(run) == f"configs/paper/run.py:{run}"
    assert _load_file(path, run).to_dict() == runs.get_run_config(run, "cpu").to_dict()
    for size in runs.SIZES:
      assert (_load_file(path, f"{run},{size}").to_dict()
              == runs.get_run_config(run, size).to_dict())


@pytest.mark.parametrize("arg, match", [("", "needs its run"), ("w8s8_9kv", "paper run 'w8s8_9kv'"),
                                        ("w8s8_1kv,huge", "config argument 'huge'")])
def test_a_bad_paper_run_argument_names_the_problem(arg, match):
  with pytest.raises(ValueError, match=match):
    _load_file(os.path.join(PAPER_DIR, "run.py"), arg)


@pytest.mark.parametrize("run", sorted(runs.RUNS))
def test_the_two_sizes_differ_only_in_size_fields(run):
  paper = flatten(config_lib.to_dict(_config(run, "paper")))
  cpu = flatten(config_lib.to_dict(_config(run, "cpu")))
  differ = {k for k in paper if paper[k] != cpu[k]}
  assert differ <= runs.SIZE_FIELDS, sorted(differ - runs.SIZE_FIELDS)
  # The paper size is Qwen3-0.6B's shape.
  m = _config(run, "paper").model
  assert (m.num_layers, m.d_model, m.num_heads, m.head_dim) == (28, 1024, 16, 128)


def test_runs_set_what_their_names_say():
  w, s = {}, {}
  for run in runs.RUNS:
    a = _config(run, "paper").model.attention
    w[run], s[run] = (a.window_tokens, a.stride) if a.kind == "fixed" else (0, 0)
  assert (w["w8s6_1kv"], s["w8s6_1kv"]) == (8, 6)
  assert (w["w12s12_1kv"], s["w12s12_1kv"]) == (12, 12)
  assert (w["w8s4_dsv4_kernel"], s["w8s4_dsv4_kernel"]) == (8, 4)
  default = _config("w8s8_1kv", "paper")
  a = default.model.attention
  assert (a.gate, a.offset_maps, a.shared_kv, a.window, a.tail, a.map_groups) == (
      "scalar", "per_offset", False, 16, False, 8)
  # Every compressed run puts its windows where the paper does: [jS, jS + W).
  for run in runs.RUNS:
    a = _config(run, "paper").model.attention
    assert a.kind == "full" or a.compress_window_align == "start", run
  assert _config("w8s6_1kv", "paper").model.attention.align_offset == 4  # 8 mod 6 = 2 right
  assert default.model.rope_dim == 128 and default.model.qk_norm
  assert _config("w8s8_1kv_rope16", "paper").model.rope_dim == 16
  assert _config("w8s8_1kv_nope", "paper").model.rope_dim == 0
  tail = _config("w8s8_8kv_tail", "paper")
  assert (tail.model.attention.tail, tail.model.attention.window, tail.model.num_kv_heads) == (
      True, 0, 8)
  dsv4 = _config("w8s4_dsv4_kernel", "paper").model.attention
  assert (dsv4.overlap, dsv4.gate, dsv4.shared_kv, dsv4.map_groups) == (True, "vector", True, 2)
  assert _config("full_4kv", "paper").model.attention.kind == "full"


def test_records_name_the_compressor():
  # The sweep's record of a run carries W, S, alignment, gate kind and offset maps; at their
  # defaults (every committed record's compressor) they are not written, so older files read
  # back, and rejudge, unchanged.
  def setup(run, config):
    return unit.describe(sweep_config.Variant(run, runs.source(run), {}, config,
                                              "/nonexistent", True))

  paper = setup("w8s6_1kv", _config("w8s6_1kv", "tiny"))
  assert (paper.compress_window, paper.chunk_size, paper.window_align, paper.gate,
          paper.offset_maps) == (8, 6, "start", "scalar", "per_offset")
  assert VariantSetup.from_json(paper.to_json()) == paper
  plain = setup("fixed", config_lib.Config(model=config_lib.ModelConfig(
      attention=config_lib.AttentionConfig(kind="fixed"))))
  added = {"compress_window", "window_align", "gate", "offset_maps"}
  assert not added & set(plain.to_json())
  assert VariantSetup.from_json(plain.to_json()) == plain
  assert (plain.compress_window, plain.window_align, plain.gate, plain.offset_maps) == (
      0, "end", "vector", "shared")


def _train_losses(config, steps):
  """Losses of ``steps`` updates of the run's optimiser on one batch of the code task's ids."""
  model = Transformer(config.model)
  t, b = config.data.seq_len, config.data.batch_size
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, config.model.vocab_size, (b, t + 1)), jnp.int32)
  batch = dict(inputs=tokens[:, :-1], targets=tokens[:, 1:],
               segment_ids=jnp.zeros((b, t), jnp.int32),
               positions=jnp.broadcast_to(jnp.arange(t), (b, t)),
               loss_mask=jnp.ones((b, t), jnp.float32))
  shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), tokens[:, :-1])["params"])
  params = jax.tree_util.tree_map(
      lambda s: jnp.asarray(rng.normal(size=s.shape) * 0.1, s.dtype), shapes)
  tx = train_state.make_optimizer(config.train)

  def step(carry, i):
    params, opt_state = carry
    grads, sums = jax.grad(lambda p: objective.loss_fn(p, model, batch, jax.random.key(i)),
                           has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), sums["loss_sum"] / sums["count"]

  run = jax.jit(lambda p: jax.lax.scan(step, (p, tx.init(p)), jnp.arange(steps))[1])
  return np.asarray(run(params))


@pytest.mark.parametrize("run", sorted(runs.RUNS))
def test_every_paper_run_trains_20_steps_at_the_tiny_size(run):
  config = _config(run, "tiny")
  losses = _train_losses(config, config.train.steps)
  assert losses.shape == (20,) and np.all(np.isfinite(losses))
  assert losses[-1] < losses[0] - 0.1, losses  # it learns the batch


def test_the_compiled_memory_plan_takes_general_windows():
  # bench/scale_plan.py's own compile path (abstract sharded inputs, compiled train step,
  # memory_analysis and cost_analysis) on its tiny model with the paper's W8/S6 compressor
  # (one layer, float32, no remat: the compile is the cost).
  from bench import scale_plan
  w, s = 8, 6
  record = scale_plan.compile_case(dict(
      devices=1, seq_len=32, variant="fixed", remat="none", config="qwen3_tiny",
      overrides={"model.num_layers": 1, "model.dtype": "float32",
                 "model.attention.chunk_size": s, "model.attention.compress_window": w,
                 "model.attention.compress_window_align": "start",
                 "model.attention.gate": "scalar", "model.attention.offset_maps": "per_offset",
                 "model.attention.shared_kv": False}))
  assert record["peak_bytes"] > record["argument_bytes"] > 0
  assert 0.5 < record["analytic_flops_per_token"] / record["compiler_flops_per_token"] < 1.5
