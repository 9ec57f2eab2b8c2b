"""Study-scale features: remat, scanned layers, gradient accumulation, bf16, FLOP counts.

Every check runs a 2-4 layer model of width 32-128 on CPU: the equalities are exact
properties of the transformations (same function, same gradients), not of model size.
"""

import dataclasses
import json
import os
import subprocess
import sys

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from chunkformer import accumulate, flops, layer_stack, objective, trainer
from chunkformer import config as config_lib
from chunkformer import runtime as runtime_lib
from chunkformer import workdir as workdir_lib
from chunkformer.config import AttentionConfig, ConfigError, ModelConfig
from chunkformer.model import Transformer
from configs import smoke

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(vocab_size=64, d_model=32, num_heads=2, num_kv_heads=1, head_dim=16, mlp_dim=64)
FIXED = AttentionConfig(kind="fixed", window=4, chunk_size=4)
# (name, layers, attention, layer_pattern, remat policy run with scanned layers); every policy
# meets two kinds, every kind one policy and the scan (one compile less per kind).
KINDS = [
    ("full", 2, AttentionConfig(), "", "dots"),
    ("fixed", 2, FIXED, "", "full"),
    # The boundary owner (layer 0) runs unrolled, layer 1 runs in the scan (reading `shared`).
    ("dynamic", 2, AttentionConfig(kind="dynamic", window=4, chunk_size=4, min_chunk=2,
                                   max_chunk=8), "", "dots_no_batch"),
    ("mixed_pattern", 4, FIXED, "chunk_size=4,overlap=true;kind=full", "dots"),
]


def _batch(rows: int, seq_len: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab, (rows, seq_len + 1)).astype(np.int32)
  mask = (rng.random((rows, seq_len)) < 0.7).astype(np.float32)  # rows score unequal counts
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
          "positions": np.broadcast_to(np.arange(seq_len, dtype=np.int32), (rows, seq_len)),
          "segment_ids": np.zeros((rows, seq_len), np.int32), "loss_mask": mask}


def _loss_and_grads(model: ModelConfig, params, batch):
  fn = jax.value_and_grad(lambda p: objective.loss_fn(p, Transformer(model), batch, None, False)[0])
  return jax.jit(fn)(params)


@pytest.mark.parametrize("name,layers,attn,pattern,policy", KINDS, ids=[k[0] for k in KINDS])
def test_remat_and_scanned_layers_give_the_plain_models_loss_and_gradients(
    name, layers, attn, pattern, policy):
  plain = ModelConfig(num_layers=layers, attention=attn, layer_pattern=pattern, **TINY)
  plain.validate()
  batch = _batch(2, 32, plain.vocab_size)
  params = nn.meta.unbox(Transformer(plain).init(jax.random.key(0), batch["inputs"])["params"])
  loss, grads = _loss_and_grads(plain, params, batch)
  variant = dataclasses.replace(plain, remat=policy, scan_layers=True)
  variant.validate()
  stacked = layer_stack.stack_params(params, variant)
  assert layer_stack.SCAN_NAME in stacked  # the scan really is in the parameter layout
  v_loss, v_grads = _loss_and_grads(variant, stacked, batch)
  chex.assert_trees_all_close(v_loss, loss, atol=1e-5, rtol=1e-5)
  chex.assert_trees_all_close(layer_stack.unstack_params(v_grads, variant), grads,
                              atol=1e-5, rtol=1e-5)
  chex.assert_trees_all_equal_structs(layer_stack.unstack_params(stacked, variant), params)


def test_scan_plan_runs_the_boundary_owner_unrolled_and_scans_whole_pattern_units():
  dynamic = ModelConfig(num_layers=5, attention=KINDS[2][2], scan_layers=True, **TINY)
  assert layer_stack.plan(dynamic) == layer_stack.Stack(unrolled=1, period=1, repeats=4)
  v4 = ModelConfig(num_layers=6, attention=FIXED, layer_pattern="chunk_size=4;chunk_size=8",
                   scan_layers=True, **TINY)
  assert layer_stack.plan(v4) == layer_stack.Stack(unrolled=0, period=2, repeats=3)


@pytest.mark.parametrize("overrides,field", [
    (dict(num_layers=3, layer_pattern="chunk_size=4;chunk_size=8"), "model.scan_layers"),
    (dict(attention=dataclasses.replace(FIXED, stagger="layers")), "stagger"),
    (dict(attention=dataclasses.replace(KINDS[2][2], boundary_group=1)), "boundary_group"),
])
def test_scan_refuses_layers_that_differ_between_repetitions(overrides, field):
  model = ModelConfig(**{**TINY, "num_layers": 4, "attention": FIXED, "scan_layers": True,
                         **overrides})
  with pytest.raises(ConfigError, match=field):
    model.validate()


def test_switching_scanned_layers_on_resume_is_refused_naming_the_field(tmp_path):
  config = config_lib.from_dict(smoke.get_config().to_dict())
  workdir_lib.prepare(str(tmp_path), config)
  scanned = dataclasses.replace(config, model=dataclasses.replace(config.model,
                                                                  scan_layers=True))
  with pytest.raises(ConfigError, match="model.scan_layers"):
    workdir_lib.prepare(str(tmp_path), scanned)
  # The remat policy changes no parameter and no number: a rerun may switch it.
  remat = dataclasses.replace(config, model=dataclasses.replace(config.model, remat="full"))
  workdir_lib.prepare(str(tmp_path), remat)


def test_grad_accumulation_over_k_micro_batches_equals_one_batch_k_times_larger():
  model = ModelConfig(num_layers=2, **TINY)
  batch = {k: jnp.asarray(v) for k, v in _batch(8, 32, model.vocab_size, seed=1).items()}
  params = nn.meta.unbox(Transformer(model).init(jax.random.key(0), batch["inputs"])["params"])
  rng = jax.random.key(3)
  run = jax.jit(lambda p, b, k: accumulate.grads_and_sums(p, Transformer(model), b, rng, k),
                static_argnums=2)
  grads, sums = run(params, batch, 1)
  acc_grads, acc_sums = run(params, batch, 4)
  chex.assert_trees_all_close(acc_grads, grads, atol=1e-6, rtol=1e-5)
  for key in ("loss_sum", "count", "correct"):
    np.testing.assert_allclose(acc_sums[key], sums[key], rtol=1e-6)
  assert float(acc_sums["aux_batches"]) == 4.0  # aux/ means divide by the micro-batches
  with pytest.raises(ConfigError, match="train.grad_accum_steps"):
    c = smoke.get_config()
    c.train.grad_accum_steps = 3  # does not divide batch_size 8
    config_lib.from_dict(c.to_dict())


def test_bf16_compute_keeps_float32_params_and_stays_within_2_percent_of_float32_loss():
  """Five AdamW steps from the same init; bf16 loss within 2% of fp32 (stated tolerance)."""
  losses, params = {}, {}
  for dtype in ("float32", "bfloat16"):
    c = smoke.get_config()
    c.model.dtype = dtype
    c.train.warmup_steps = 0
    rt = runtime_lib.build(config_lib.from_dict(c.to_dict()), jax.devices()[:1])
    state, step = rt.init_state(), trainer.make_train_step(rt)
    with rt.context():
      for i in range(5):
        state, sums, _ = step(state, rt.batch("train", i))
    losses[dtype] = float(sums["loss_sum"] / sums["count"])
    params[dtype] = state.params
  assert np.isfinite(losses["bfloat16"])
  assert abs(losses["bfloat16"] - losses["float32"]) <= 0.02 * losses["float32"], losses
  assert {x.dtype for x in jax.tree.leaves(params["bfloat16"])} == {jnp.dtype(jnp.float32)}


@pytest.mark.parametrize("kind", ["full", "fixed"])
def test_analytic_training_flops_agree_with_xla_cost_analysis_within_10_percent(kind):
  attn = AttentionConfig() if kind == "full" else dataclasses.replace(FIXED, window=8)
  model = ModelConfig(vocab_size=256, num_layers=2, d_model=128, num_heads=4, num_kv_heads=2,
                      head_dim=32, mlp_dim=512, attention=attn)
  batch = {k: jnp.asarray(v) for k, v in _batch(2, 64, model.vocab_size).items()}
  params = nn.meta.unbox(jax.eval_shape(
      lambda: Transformer(model).init(jax.random.key(0), batch["inputs"]))["params"])
  step = jax.jit(jax.grad(lambda p, b: objective.loss_fn(p, Transformer(model), b, None)[0]))
  cost = step.lower(params, batch).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  compiler = cost["flops"] / batch["inputs"].size
  analytic = flops.train_flops_per_token(model, 64)
  assert abs(analytic - compiler) <= 0.1 * compiler, (analytic, compiler)


def test_peak_flops_come_from_the_device_table_or_the_configured_value():
  class Device:
    def __init__(self, kind, platform="gpu"):
      self.device_kind, self.platform = kind, platform

  assert flops.peak_flops_per_device(Device("NVIDIA H100 80GB HBM3"))[0] == 989e12
  assert flops.peak_flops_per_device(Device("TPU v5 lite", "tpu"))[0] == 197e12
  assert flops.peak_flops_per_device(Device("TPU v5", "tpu"))[0] == 459e12
  assert flops.peak_flops_per_device(Device("Odd GPU"), configured_tflops=100.0)[0] == 1e14
  peak, source = flops.peak_flops_per_device(Device("Odd GPU"))
  assert np.isnan(peak) and "train.peak_tflops" in source
  assert flops.mfu(1e9, 100.0, 1e12, 2) == pytest.approx(0.05)


def test_mesh_fsdp_auto_takes_every_device_the_other_axes_leave():
  assert config_lib.MeshConfig(data=1, fsdp=-1, tensor=2).shape(8) == (1, 4, 1, 2)
  assert config_lib.MeshConfig(data=1, fsdp=-1, context=2, tensor=2).shape(8) == (1, 2, 2, 2)
  with pytest.raises(ConfigError, match="mesh.fsdp"):
    config_lib.MeshConfig(data=-1, fsdp=-1).shape(8)


def test_study_configs_resolve_with_the_qwen3_0p6b_shape():
  from configs.lm import qwen3_0p6b, qwen3_tiny

  for variant in qwen3_0p6b.VARIANTS:
    config = config_lib.from_dict(qwen3_0p6b.get_config(variant).to_dict())
    m = config.model
    assert (m.num_layers, m.d_model, m.num_heads, m.num_kv_heads, m.head_dim, m.mlp_dim,
            m.vocab_size, m.rope_base) == (28, 1024, 16, 8, 128, 3072, 151936, 1e6)
    config_lib.from_dict(qwen3_tiny.get_config(variant).to_dict())
  params = jax.eval_shape(lambda: Transformer(m).init(jax.random.key(0),
                                                      jnp.zeros((1, 8), jnp.int32)))
  # Qwen3-0.6B: 596M parameters with tied embeddings (this one is the v4 variant: + compressors).
  full = config_lib.from_dict(qwen3_0p6b.get_config("full").to_dict()).model
  n_full = sum(x.size for x in jax.tree.leaves(nn.meta.unbox(jax.eval_shape(
      lambda: Transformer(full).init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))))))
  assert abs(n_full - 596_049_920) < 1e6, n_full
  assert sum(x.size for x in jax.tree.leaves(nn.meta.unbox(params))) > n_full


def test_scale_plan_small_compiles_and_reports_peak_bytes_and_fits(tmp_path):
  out = str(tmp_path / "plan")
  subprocess.run([sys.executable, "bench/scale_plan.py", "--small", "--variants", "fixed",
                  "--remats", "full", "--out", out], cwd=ROOT, check=True,
                 env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True)
  records = json.load(open(out + ".json"))["records"]
  assert [r["variant"] for r in records] == ["fixed"]
  for r in records:
    assert "error" not in r, r
    assert r["peak_bytes"] > r["argument_bytes"] > 0
    assert 0.5 < r["analytic_flops_per_token"] / r["compiler_flops_per_token"] < 1.5
    parts = r["parts"]  # the peak split: measured state + formulas + the measured rest
    assert parts["state"] == r["argument_bytes"]
    assert sum(parts[k] for k in ("state", "activations", "logits_loss", "rest")) == (
        r["peak_bytes"])
    # qwen3_tiny, 2 layers, T = 256, bf16, one row per batch shard: 2 x 256 x 128 x 2 bytes.
    assert parts["activations"] == 2 * 256 * 128 * 2 and parts["loss_token_tile"] == 0
  assert "CPU-compiled memory is a proxy" in open(out + ".md").read()
