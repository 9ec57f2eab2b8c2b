"""Hugging Face Qwen3 checkpoints in and out of chunkformer run directories.

  python -m chunkformer.convert.qwen3 --input HF_DIR --output WORKDIR [--tokenizer T] [--seq_len N]
  python -m chunkformer.convert.qwen3 --export --input WORKDIR --output HF_DIR

Import reads ``config.json`` and the safetensors weights (numpy, no torch) and writes a run
directory that training, evaluation and the sweeps restore: ``config.json`` (a chunkformer
config with ``train.steps = 0``, so the run counts as finished at step 0), an Orbax checkpoint of
step 0 (fresh optimiser state), ``pretrained.json`` (source, the Qwen3 config, tokenizer) and a
copy of ``tokenizer.json`` when the checkpoint has one (or ``--tokenizer`` names one).
Everything is checked first (settings, every tensor name and shape from the file headers);
nothing is written unless all of it maps.

The mapping is exact: chunkformer's decoder is Qwen3's (pre-norm RMSNorm blocks, QK-norm per
head before RoPE, half-split RoPE over the whole head, GQA, SwiGLU with SiLU, no biases); Qwen3's
``rms_norm_eps`` becomes ``model.norm_eps`` and a tied head computes plain ``x E^T``
(``model.scale_tied_logits = False``). Weights are transposes/reshapes of HF's ``[out, in]``
matrices, so export(import(x)) reproduces float32 tensors bit for bit. Refused, naming the
setting: other model types (MoE ``qwen3_moe``), activations other than SiLU, attention biases,
sliding-window layers, RoPE scaling (``rope_type`` other than "default") and partial rotary.
Export writes only what Qwen3 can express: full attention in every layer, full rotary, QK-norm,
no token shift, and (if tied) unscaled tied logits.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import shutil
import sys
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from chunkformer import checkpointing, run_tokens
from chunkformer import runtime as runtime_lib
from chunkformer import train_state as state_lib
from chunkformer import workdir as workdir_lib
from chunkformer.config import (
  AttentionConfig,
  Config,
  ConfigError,
  DataConfig,
  ModelConfig,
  TrainConfig,
)
from chunkformer.convert import hf_files
from chunkformer.convert.hf_files import CheckpointError
from chunkformer.run_tokens import RECORD_FILE, read_record

MODEL_TYPE = "qwen3"
_UNSUPPORTED_PRESENT = ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                        "decoder_sparse_step", "mlp_only_layers")


def _setting(hf: dict[str, Any], name: str, message: str) -> CheckpointError:
  return CheckpointError(f"config.json setting '{name}' = {hf.get(name)!r}: {message}")


def _rope(hf: dict[str, Any]) -> float:
  """RoPE base, refusing scaled or partial rotary (``rope_parameters`` or legacy fields)."""
  params = hf.get("rope_parameters") or {}
  legacy = hf.get("rope_scaling") or {}
  rope_type = params.get("rope_type", legacy.get("rope_type", legacy.get("type", "default")))
  if rope_type not in (None, "default"):
    field = "rope_parameters" if params else "rope_scaling"
    raise CheckpointError(f"config.json setting '{field}.rope_type' = {rope_type!r}: only "
                          "'default' RoPE is implemented (no YaRN/linear/dynamic scaling)")
  for source, name in ((params, "rope_parameters"), (hf, "")):
    factor = source.get("partial_rotary_factor", 1.0)
    if factor != 1.0:
      field = f"{name}.partial_rotary_factor" if name else "partial_rotary_factor"
      raise CheckpointError(f"config.json setting '{field}' = {factor!r}: Qwen3 rotates the "
                            "whole head; partial rotary is not supported")
  theta = params.get("rope_theta", hf.get("rope_theta"))
  if theta is None:
    raise _setting(hf, "rope_theta", "missing (neither rope_parameters.rope_theta nor rope_theta)")
  return float(theta)


def model_config(hf: dict[str, Any]) -> ModelConfig:
  """The chunkformer ModelConfig computing what the Qwen3 config computes, or CheckpointError."""
  if hf.get("model_type") != MODEL_TYPE:
    raise _setting(hf, "model_type", f"only {MODEL_TYPE!r} (dense Qwen3) is supported")
  for name in _UNSUPPORTED_PRESENT:
    if hf.get(name):
      raise _setting(hf, name, "mixture-of-experts layers are not supported")
  if hf.get("hidden_act", "silu") != "silu":
    raise _setting(hf, "hidden_act", "only 'silu' (SwiGLU) is supported")
  if hf.get("attention_bias", False):
    raise _setting(hf, "attention_bias", "chunkformer's q/k/v/o projections have no bias")
  if hf.get("use_sliding_window", False):
    raise _setting(hf, "use_sliding_window", "sliding-window layers are not supported")
  kinds = set(hf.get("layer_types") or ["full_attention"])
  if kinds != {"full_attention"}:
    raise _setting(hf, "layer_types", "every layer must be 'full_attention'")
  for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads"):
    if not isinstance(hf.get(name), int):
      raise _setting(hf, name, "missing or not an integer")
  heads = hf["num_attention_heads"]
  model = ModelConfig(
      vocab_size=hf["vocab_size"], num_layers=hf["num_hidden_layers"], d_model=hf["hidden_size"],
      num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
      mlp_dim=hf["intermediate_size"], rope=True, rope_fraction=1.0, rope_base=_rope(hf),
      qk_norm=True, norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)), scale_tied_logits=False,
      key_shift=0, attention=AttentionConfig(kind="full"))
  try:
    model.validate()
  except ConfigError as e:
    raise CheckpointError(f"config.json: the model does not fit chunkformer ({e})") from None
  return model


def exportable(model: ModelConfig) -> None:
  """Raises ConfigError naming the field that Qwen3's format cannot express."""
  checks = (
      (all(a.kind == "full" for a in model.layers), "model.attention.kind",
       "every layer must use full attention (compressed kinds have no Qwen3 equivalent)"),
      (model.rope and model.rope_fraction == 1.0, "model.rope_fraction",
       "Qwen3 rotates the whole head (model.rope=True, rope_fraction=1.0)"),
      (model.qk_norm, "model.qk_norm", "Qwen3 normalises queries and keys"),
      (model.key_shift == 0, "model.key_shift", "Qwen3 has no token shift"),
      (not (model.tie_embeddings and model.scale_tied_logits), "model.scale_tied_logits",
       "Qwen3's tied head is unscaled; set it False"),
      (not model.scan_layers, "model.scan_layers",
       "export reads per-layer parameters; convert them with layer_stack.unstack_params"),
  )
  for ok, field, message in checks:
    if not ok:
      raise ConfigError(f"config field '{field}': cannot export to Qwen3: {message}")


@dataclasses.dataclass(frozen=True)
class Tensor:
  """One HF tensor and the chunkformer parameter it becomes."""

  hf_name: str
  path: tuple[str, ...]  # into the params tree
  hf_shape: tuple[int, ...]
  to_params: Callable[[np.ndarray], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]


def _same(w):
  return w


def _linear(hf_name, path, out_shape, in_dim) -> Tensor:
  """HF Linear weight [prod(out), in] <-> chunkformer kernel [in, *out]."""
  flat = int(np.prod(out_shape))
  return Tensor(hf_name, path, (flat, in_dim),
                lambda w: w.T.reshape((in_dim,) + out_shape),
                lambda k: k.reshape(in_dim, flat).T)


def tensors(model: ModelConfig) -> list[Tensor]:
  """Every tensor of a Qwen3 checkpoint of ``model`` (without lm_head when tied)."""
  e, h, k, d, f = (model.d_model, model.num_heads, model.num_kv_heads, model.head_dim,
                   model.mlp_dim)
  out = [Tensor("model.embed_tokens.weight", ("embedding",), (model.vocab_size, e), _same, _same),
         Tensor("model.norm.weight", ("final_norm", "scale"), (e,), _same, _same)]
  for i in range(model.num_layers):
    hf, cf = f"model.layers.{i}.", (f"block_{i}",)
    attn = cf + ("attn",)
    out += [
        _linear(hf + "self_attn.q_proj.weight", attn + ("qkv", "q", "kernel"), (h, d), e),
        _linear(hf + "self_attn.k_proj.weight", attn + ("qkv", "k", "kernel"), (k, d), e),
        _linear(hf + "self_attn.v_proj.weight", attn + ("qkv", "v", "kernel"), (k, d), e),
        Tensor(hf + "self_attn.o_proj.weight", attn + ("out", "o", "kernel"), (e, h * d),
               lambda w, h=h, d=d, e=e: w.T.reshape(h, d, e),
               lambda kk, h=h, d=d, e=e: kk.reshape(h * d, e).T),
        Tensor(hf + "self_attn.q_norm.weight", attn + ("qkv", "q_norm", "scale"), (d,), _same,
               _same),
        Tensor(hf + "self_attn.k_norm.weight", attn + ("qkv", "k_norm", "scale"), (d,), _same,
               _same),
        Tensor(hf + "input_layernorm.weight", cf + ("attn_norm", "scale"), (e,), _same, _same),
        Tensor(hf + "post_attention_layernorm.weight", cf + ("mlp_norm", "scale"), (e,), _same,
               _same),
        _linear(hf + "mlp.gate_proj.weight", cf + ("mlp", "gate", "kernel"), (f,), e),
        _linear(hf + "mlp.up_proj.weight", cf + ("mlp", "up", "kernel"), (f,), e),
        _linear(hf + "mlp.down_proj.weight", cf + ("mlp", "down", "kernel"), (e,), f),
    ]
  if not model.tie_embeddings:
    out.append(_linear("lm_head.weight", ("unembed", "kernel"), (model.vocab_size,), e))
  return out


def check_weights(directory: str, model: ModelConfig) -> dict[str, tuple[str, str, tuple]]:
  """The checkpoint's tensor inventory, checked against ``model`` from the headers alone."""
  found = hf_files.inventory(directory)
  expected = {t.hf_name: t for t in tensors(model)}
  tied_head = model.tie_embeddings and "lm_head.weight" in found
  missing = sorted(set(expected) - set(found))
  if missing:
    raise CheckpointError(f"{directory}: missing weights {missing[:5]}"
                          f"{' ...' if len(missing) > 5 else ''} ({len(missing)} in all)")
  extra = sorted(set(found) - set(expected) - ({"lm_head.weight"} if tied_head else set()))
  if extra:
    raise CheckpointError(f"{found[extra[0]][0]}: unexpected weights {extra[:5]}"
                          f"{' ...' if len(extra) > 5 else ''} ({len(extra)} in all; the config "
                          "does not use them)")
  for name, t in expected.items():
    path, dtype, shape = found[name]
    if shape != t.hf_shape:
      raise CheckpointError(f"{path}: tensor {name!r} has shape {shape}, config.json implies "
                            f"{t.hf_shape}")
    if dtype not in ("F32", "BF16", "F16"):
      raise CheckpointError(f"{path}: tensor {name!r} has dtype {dtype}; expected F32/BF16/F16")
  if tied_head and found["lm_head.weight"][2] != expected["model.embed_tokens.weight"].hf_shape:
    raise CheckpointError(f"{found['lm_head.weight'][0]}: tensor 'lm_head.weight' has shape "
                          f"{found['lm_head.weight'][2]}, unlike the tied embedding")
  return found


def params_from_hf(model: ModelConfig, hf_tensors: dict[str, np.ndarray]) -> dict[str, Any]:
  """The chunkformer params tree (float32 numpy) of checked HF tensors."""
  if model.tie_embeddings and "lm_head.weight" in hf_tensors:
    if not np.array_equal(hf_tensors["lm_head.weight"], hf_tensors["model.embed_tokens.weight"]):
      raise CheckpointError("config.json setting 'tie_word_embeddings' = True, but "
                            "lm_head.weight differs from model.embed_tokens.weight")
  params: dict[str, Any] = {}
  for t in tensors(model):
    node = params
    for key in t.path[:-1]:
      node = node.setdefault(key, {})
    node[t.path[-1]] = np.ascontiguousarray(t.to_params(hf_tensors[t.hf_name]), np.float32)
  return params


def hf_from_params(model: ModelConfig, params: Any) -> dict[str, np.ndarray]:
  out = {}
  for t in tensors(model):
    value = params
    for key in t.path:
      value = value[key]
    out[t.hf_name] = np.ascontiguousarray(t.to_hf(np.asarray(value, np.float32)))
  return out


def hf_config(model: ModelConfig, base: dict[str, Any] | None = None) -> dict[str, Any]:
  """A Qwen3 config.json for ``model`` (``base``: the imported one, whose other keys stay)."""
  out = dict(base or {"max_position_embeddings": 32768, "initializer_range": 0.02,
                      "use_cache": True, "attention_dropout": 0.0, "max_window_layers": 28})
  out.pop("torch_dtype", None)
  out.update(
      architectures=["Qwen3ForCausalLM"], model_type=MODEL_TYPE, vocab_size=model.vocab_size,
      hidden_size=model.d_model, intermediate_size=model.mlp_dim,
      num_hidden_layers=model.num_layers, num_attention_heads=model.num_heads,
      num_key_value_heads=model.num_kv_heads, head_dim=model.head_dim, hidden_act="silu",
      rms_norm_eps=model.norm_eps, tie_word_embeddings=model.tie_embeddings,
      attention_bias=False, use_sliding_window=False, sliding_window=None,
      layer_types=["full_attention"] * model.num_layers, dtype="float32",
      rope_parameters={"rope_type": "default", "rope_theta": model.rope_base})
  out.pop("rope_theta", None)
  out.pop("rope_scaling", None)
  return out


def _check_tokenizer(path: str, vocab_size: int) -> None:
  try:
    tokenizer = run_tokens.load_tokenizer(path)
  except Exception as e:  # noqa: BLE001 -- tokenizers raises bare Exception on a bad file
    raise CheckpointError(f"{path}: not a usable tokenizer.json ({e})") from None
  if tokenizer.vocab_size > vocab_size:
    raise CheckpointError(f"{path}: {tokenizer.vocab_size} tokens exceed the model's "
                          f"vocab_size {vocab_size}")


def _sha256(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def import_checkpoint(input_dir: str, output_dir: str, tokenizer: str | None = None,
                      seq_len: int = 256) -> Config:
  """Writes the run directory of the Qwen3 checkpoint in ``input_dir`` (module docstring).

  Raises CheckpointError (naming the file or setting) or ConfigError before writing anything.
  """
  hf = hf_files.read_config(input_dir)
  model = model_config(hf)
  found = check_weights(input_dir, model)
  if tokenizer is None:
    candidate = os.path.join(input_dir, hf_files.TOKENIZER_FILE)
    tokenizer = candidate if os.path.isfile(candidate) else None
  elif not os.path.isfile(tokenizer):
    raise CheckpointError(f"--tokenizer {tokenizer!r}: no such file")
  if tokenizer is not None:
    _check_tokenizer(tokenizer, model.vocab_size)
  if os.path.isdir(output_dir) and os.listdir(output_dir):
    raise CheckpointError(f"--output {output_dir!r} is not empty; choose a new run directory "
                          "(nothing was written)")
  config = Config(model=model, data=DataConfig(seq_len=seq_len), train=TrainConfig(steps=0))
  config.validate()
  params = params_from_hf(model, hf_files.read_tensors(found))
  rt = runtime_lib.build(config)
  state = state_from_params(rt, params)
  workdir_lib.prepare(output_dir, config)
  record = {"format": "huggingface-qwen3", "source": os.path.abspath(input_dir),
            "hf_config": hf, "tokenizer": None, "tokenizer_sha256": None}
  if tokenizer is not None:
    shutil.copyfile(tokenizer, os.path.join(output_dir, hf_files.TOKENIZER_FILE))
    record.update(tokenizer=hf_files.TOKENIZER_FILE, tokenizer_sha256=_sha256(tokenizer))
  workdir_lib.write_json(output_dir, RECORD_FILE, record)
  checkpointer = checkpointing.Checkpointer(output_dir, config.train)
  try:
    checkpointer.save(0, state, force=True)
  finally:
    checkpointer.close()
  return config


def state_from_params(rt: runtime_lib.Runtime, params: Any) -> state_lib.TrainState:
  """Step 0 with ``params`` placed in their shards and a fresh optimiser state."""
  shardings = rt.state_shardings
  placed = jax.tree.map(lambda x, s: jax.device_put(np.asarray(x, s.dtype), s.sharding), params,
                        rt.abstract_state.params)
  with jax.set_mesh(rt.mesh):
    opt_state = jax.jit(rt.tx.init, out_shardings=shardings.opt_state)(placed)
  step = jax.device_put(np.zeros((), np.int32), shardings.step)
  return state_lib.TrainState(step=step, params=placed, opt_state=opt_state)


def export_checkpoint(workdir: str, output_dir: str) -> dict[str, Any]:
  """Writes ``config.json`` + ``model.safetensors`` (float32) of the newest checkpoint."""
  config = workdir_lib.read_config(workdir)
  exportable(config.model)
  hf_files.check_writable(output_dir)
  _, _, params, _ = runtime_lib.restore_newest(workdir)
  record = read_record(workdir) or {}
  hf = hf_config(config.model, record.get("hf_config"))
  hf_files.write_checkpoint(output_dir, hf, hf_from_params(config.model, params))
  if record.get("tokenizer"):
    shutil.copyfile(os.path.join(workdir, record["tokenizer"]),
                    os.path.join(output_dir, hf_files.TOKENIZER_FILE))
  return hf


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m chunkformer.convert.qwen3",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--input", required=True,
                      help="HF checkpoint directory (import) or run directory (--export)")
  parser.add_argument("--output", required=True, help="new run directory, or HF directory")
  parser.add_argument("--export", action="store_true", help="run directory -> HF checkpoint")
  parser.add_argument("--tokenizer", default=None,
                      help="tokenizer.json to record (default: INPUT/tokenizer.json if present)")
  parser.add_argument("--seq_len", type=int, default=256,
                      help="data.seq_len recorded in the run (rows the sweeps build)")
  args = parser.parse_args(argv)
  try:
    if args.export:
      export_checkpoint(args.input, args.output)
      print(f"wrote {args.output}/{hf_files.CONFIG_FILE} and {hf_files.WEIGHTS_FILE}")
    else:
      config = import_checkpoint(args.input, args.output, args.tokenizer, args.seq_len)
      m = config.model
      print(f"wrote run {args.output}: {m.num_layers} layers, d_model {m.d_model}, "
            f"{m.num_heads}/{m.num_kv_heads} heads, vocab {m.vocab_size}")
  except (CheckpointError, ConfigError) as e:
    sys.exit(f"error: {e}")


if __name__ == "__main__":
  main()
