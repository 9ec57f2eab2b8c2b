"""Frozen, validated run configuration.

`ml_collections.ConfigDict` files (``configs/*.py``) are the user-facing format; they are
converted exactly once, here, into frozen dataclasses. Modules never see a ConfigDict.
Every check raises ``ConfigError`` naming the offending field and the allowed values, so bad
input fails before anything is compiled or written.

Per-layer attention: ``model.attention`` holds the defaults for every layer and
``model.layer_pattern`` optionally overrides fields per layer, cycled over the layers:
``"chunk_size=4,overlap=true;chunk_size=128"`` gives DeepSeek-V4's alternating CSA/HCA layout
(layer 0, 2, ... get M=4 with overlap; layers 1, 3, ... get M=128). An empty spec between
semicolons keeps the defaults for that layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from kernels.implementation import IMPLEMENTATIONS  # one list, owned by the kernels

ATTENTION_KINDS = ("full", "window", "fixed", "dynamic")
POOLINGS = ("gated", "gated_no_bias", "mean", "mlp")
BOUNDARY_PREDICTORS = ("router", "delimiter", "fixed")
ROUTER_RULES = ("start", "end")
STAGGER_MODES = ("none", "layers", "heads")
LAYOUTS = ("qwen3", "deepseek_v4")
INDEXERS = ("simple", "lightning")
TASKS = ("kv", "code", "corpus")
DTYPES = ("float32", "bfloat16")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")  # chunkformer/layer_scan.py


class ConfigError(ValueError):
  """A config field holds a value the framework cannot run."""


def _require(ok: bool, field: str, message: str) -> None:
  if not ok:
    raise ConfigError(f"config field '{field}': {message}")


def _require_positive(obj: Any, names: tuple[str, ...], prefix: str) -> None:
  for name in names:
    value = getattr(obj, name)
    _require(value >= 1, f"{prefix}.{name}", f"must be >= 1, got {value}")


def _one_of(value: Any, allowed: tuple[str, ...], field: str) -> None:
  _require(value in allowed, field, f"got {value!r}, allowed: {', '.join(allowed)}")


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
  """One layer's attention. Fields irrelevant to ``kind`` are ignored by that kind."""

  kind: str = "full"  # full | window (sliding window only) | fixed | dynamic
  window: int = 0  # raw-token sliding window W in tokens; 0 = no raw tokens besides entries
  chunk_size: int = 4  # M: tokens pooled into one entry (dynamic: target mean chunk length)
  pooling: str = "gated"  # gated | gated_no_bias | mean | mlp
  overlap: bool = False  # DeepSeek CSA: each entry pools 2M slots across two chunks
  shared_kv: bool = True  # one compressed vector serves as key and value (DeepSeek MQA)
  sink: bool = False  # learned per-head sink logit (value zero) in the softmax
  topk: int = 0  # attend only to the top-k entries by an indexer score; 0 = all entries
  chunk_offset: int = 0  # phase shift of fixed chunk boundaries in tokens
  stagger: str = "none"  # none | layers | heads: spread chunk offsets over layers or kv heads
  random_phase: bool = False  # training only: a random global chunk offset per row
  # Dynamic chunking (kind == "dynamic").
  boundary: str = "router"  # router (learned, H-Net) | delimiter (rule) | fixed (every M tokens)
  router_rule: str = "start"  # router's p_t: t starts a chunk (H-Net) | t ends its chunk
  min_chunk: int = 1  # tokens; shortest chunk the predictor may close
  max_chunk: int = 16  # tokens; a chunk is forced closed at this length
  capacity_multiple: int = 8  # entry capacity per row padded to this multiple
  entry_capacity: int = 0  # packed entries per row; 0 = ceil(seq_len / shortest chunk), padded
  delimiters: str = ""  # comma-separated token ids that close a chunk (delimiter rule)
  boundary_group: int = 0  # layers sharing one boundary prediction; 0 = all layers share
  ratio_loss_weight: float = 0.03  # weight of the H-Net compression-ratio loss
  implementation: str = "xla"  # xla | pallas_gpu | pallas_tpu (kernels/)
  interpret: bool = False  # run Pallas kernels in interpret mode (CPU tests)
  # DeepSeek-V4 fidelity (attention/v4_projection.py, attention/lightning_indexer.py).
  layout: str = "qwen3"  # qwen3 (q/k/v/o) | deepseek_v4 (low-rank q, K = V, grouped low-rank o)
  derotate: bool = True  # rotate values carrying RoPE back by the query position (reference)
  query_rank: int = 64  # deepseek_v4: width of the low-rank query q_a (channels)
  output_rank: int = 64  # deepseek_v4: low-rank width per output group (channels)
  output_groups: int = 1  # deepseek_v4: groups of heads in the output projection
  indexer: str = "simple"  # top-k scorer: simple (one query per kv head) | lightning (V4)
  index_heads: int = 4  # lightning indexer heads
  index_head_dim: int = 32  # lightning indexer head dim (its own compressor's width)
  indexer_loss_weight: float = 1.0  # lightning: weight of the KL to the attention's entry mass

  def validate(self, field: str, num_kv_heads: int, head_dim: int, vocab_size: int) -> None:
    _one_of(self.kind, ATTENTION_KINDS, f"{field}.kind")
    _one_of(self.pooling, POOLINGS, f"{field}.pooling")
    _one_of(self.stagger, STAGGER_MODES, f"{field}.stagger")
    _one_of(self.boundary, BOUNDARY_PREDICTORS, f"{field}.boundary")
    _one_of(self.router_rule, ROUTER_RULES, f"{field}.router_rule")
    _one_of(self.implementation, IMPLEMENTATIONS, f"{field}.implementation")
    _one_of(self.layout, LAYOUTS, f"{field}.layout")
    _one_of(self.indexer, INDEXERS, f"{field}.indexer")
    if self.layout == "deepseek_v4":
      _require(self.kind in ("window", "fixed", "dynamic"), f"{field}.layout",
               f"'deepseek_v4' serves kinds window, fixed and dynamic, not {self.kind!r}")
      for name in ("query_rank", "output_rank", "output_groups"):
        _require(getattr(self, name) >= 1, f"{field}.{name}", "must be >= 1")
    if self.indexer == "lightning" and self.topk:
      _require(self.layout == "deepseek_v4", f"{field}.indexer",
               "the lightning indexer reads the low-rank query: needs layout 'deepseek_v4'")
      for name in ("index_heads", "index_head_dim"):
        _require(getattr(self, name) >= 1, f"{field}.{name}", "must be >= 1")
      _require(self.stagger != "heads" or num_kv_heads == 1, f"{field}.stagger",
               "the lightning indexer's entries follow one chunking shared by the kv heads")
      _require(self.index_head_dim % 2 == 0, f"{field}.index_head_dim",
               f"must be even (overlap halves, RoPE pairs), got {self.index_head_dim}")
      _require(self.indexer_loss_weight >= 0, f"{field}.indexer_loss_weight", "must be >= 0")
    _require(self.window >= 0, f"{field}.window", f"must be >= 0, got {self.window}")
    _require(self.chunk_size >= 1, f"{field}.chunk_size", f"must be >= 1, got {self.chunk_size}")
    _require(self.topk >= 0, f"{field}.topk", f"must be >= 0, got {self.topk}")
    _require(self.chunk_offset >= 0, f"{field}.chunk_offset", "must be >= 0")
    if self.kind == "window":
      _require(self.window >= 1, f"{field}.window", "kind 'window' needs window >= 1")
    if self.overlap and self.kind in ("fixed", "dynamic"):
      _require(
          head_dim % 2 == 0,
          f"{field}.overlap",
          f"overlap splits the entry channels in two halves; head_dim {head_dim} is odd",
      )
    if self.kind == "dynamic":
      _require(self.min_chunk >= 1, f"{field}.min_chunk", "must be >= 1")
      _require(
          self.max_chunk >= self.min_chunk,
          f"{field}.max_chunk",
          f"must be >= min_chunk ({self.min_chunk}), got {self.max_chunk}",
      )
      if self.boundary != "fixed":  # fixed boundaries ignore min/max: every chunk has M tokens
        _require(
            self.min_chunk <= self.chunk_size <= self.max_chunk,
            f"{field}.chunk_size",
            f"target chunk length {self.chunk_size} must lie in "
            f"[min_chunk={self.min_chunk}, max_chunk={self.max_chunk}]",
        )
      if self.boundary == "router":
        _require(self.chunk_size >= 2, f"{field}.chunk_size",
                 "the router's ratio loss N/(N-1)(...) needs a target chunk length >= 2")
      _require(self.pooling in ("gated", "gated_no_bias", "mean"), f"{field}.pooling",
               f"kind 'dynamic' pools variable chunks with gated | gated_no_bias | mean, "
               f"got {self.pooling!r}")
      for name in ("overlap", "random_phase"):
        _require(not getattr(self, name), f"{field}.{name}",
                 "not supported by kind 'dynamic' (a fixed-kind option)")
      _require(self.topk == 0, f"{field}.topk", "not supported by kind 'dynamic'")
      _require(self.stagger == "none", f"{field}.stagger",
               "not supported by kind 'dynamic' (a fixed-kind option)")
      _require(self.entry_capacity >= 0, f"{field}.entry_capacity", "must be >= 0 (0 = auto)")
      _require(
          self.capacity_multiple in (1, 8, 16, 128),
          f"{field}.capacity_multiple",
          f"got {self.capacity_multiple}, allowed: 1, 8, 16, 128",
      )
      for token in self.delimiter_ids:
        _require(
            0 <= token < vocab_size,
            f"{field}.delimiters",
            f"token id {token} outside the vocabulary [0, {vocab_size})",
        )
      if self.boundary == "delimiter":
        _require(bool(self.delimiter_ids), f"{field}.delimiters", "delimiter rule needs ids")
    if self.implementation != "xla":
      # The Pallas kernels (kernels.chunk_attention) read one end position per entry, shared by
      # the kv heads, and see every visible entry.
      _require(self.kind in ("fixed", "dynamic"), f"{field}.implementation",
               f"{self.implementation!r} serves kinds 'fixed' and 'dynamic', not {self.kind!r}")
      _require(self.topk == 0, f"{field}.topk",
               f"the indexer's top-k selection runs only with implementation 'xla', "
               f"not {self.implementation!r}")
      _require(self.stagger != "heads" or num_kv_heads == 1, f"{field}.stagger",
               f"per-head chunk offsets run only with implementation 'xla', "
               f"not {self.implementation!r}")

  @property
  def shortest_chunk(self) -> int:
    """Fewest tokens a closed chunk of kind 'dynamic' can hold (bounds the entries per row)."""
    if self.boundary == "fixed":  # the partial first chunk under an offset
      return self.chunk_size - self.chunk_offset % self.chunk_size
    return self.min_chunk

  @property
  def delimiter_ids(self) -> tuple[int, ...]:
    if not self.delimiters.strip():
      return ()
    try:
      return tuple(int(t) for t in self.delimiters.split(","))
    except ValueError as e:
      raise ConfigError(
          f"config field 'delimiters': expected comma-separated ints, got {self.delimiters!r}"
      ) from e


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """A Qwen3-style decoder. Head dims in channels, widths in channels."""

  vocab_size: int = 256
  num_layers: int = 2
  d_model: int = 128  # E
  num_heads: int = 4  # H query heads
  num_kv_heads: int = 4  # K key/value heads (1 = MQA); must divide num_heads
  head_dim: int = 32  # D
  mlp_dim: int = 512  # SwiGLU hidden width
  rope: bool = True  # rotary position embedding on queries, keys and entries
  rope_fraction: float = 1.0  # fraction of head_dim that rotates (partial rotary)
  rope_base: float = 10000.0
  qk_norm: bool = True  # RMSNorm per head on queries and keys (Qwen3)
  norm_eps: float = 1e-6  # epsilon of the block, final and QK RMSNorms (Qwen3's rms_norm_eps)
  tie_embeddings: bool = True
  scale_tied_logits: bool = True  # tied head: logits / sqrt(d_model) (unit-scale embeddings);
  # False = plain x E^T, as Hugging Face Qwen3 (set by chunkformer/convert/qwen3.py)
  key_shift: int = 0  # width of a causal conv mixing x_{t-w+1..t} into keys; 0 = off
  value_shift: bool = False  # apply the same token shift to values
  dtype: str = "float32"  # activation dtype
  # RoPE of compressed layers (kinds fixed, dynamic), as DeepSeek-V4: own base, YaRN.
  compressed_rope_base: float = 0.0  # 0 = rope_base (DeepSeek-V4: 160000)
  yarn_factor: float = 1.0  # YaRN context extension factor on compressed layers; 1 = off
  yarn_original_len: int = 0  # tokens the compressed base was trained for; 0 = no YaRN
  yarn_beta_fast: float = 32.0  # YaRN ramp bounds (rotations), as the reference
  yarn_beta_slow: float = 1.0
  param_dtype: str = "float32"  # parameter and optimiser-state dtype
  remat: str = "none"  # none | full | dots | dots_no_batch: jax.checkpoint policy per block
  scan_layers: bool = False  # nn.scan over the repeating unit of layer_pattern (layer_scan.py)
  attention: AttentionConfig = AttentionConfig()
  layer_pattern: str = ""  # per-layer attention overrides, see module docstring

  @property
  def rope_dim(self) -> int:
    """Rotating channels per head (even)."""
    return int(round(self.head_dim * self.rope_fraction / 2)) * 2 if self.rope else 0

  def layer_attention(self, layer: int) -> AttentionConfig:
    return self.layers[layer]

  @property
  def layers(self) -> tuple[AttentionConfig, ...]:
    return _resolve_layer_pattern(self.attention, self.layer_pattern, self.num_layers)

  @property
  def pattern_period(self) -> int:
    """Layers in one repetition of ``layer_pattern`` (1 without a pattern)."""
    return len(self.layer_pattern.split(";")) if self.layer_pattern.strip() else 1

  def validate(self) -> None:
    _require_positive(self, ("vocab_size", "num_layers", "d_model", "num_heads", "num_kv_heads",
                             "head_dim", "mlp_dim"), "model")
    _require(
        self.num_heads % self.num_kv_heads == 0,
        "model.num_kv_heads",
        f"must divide num_heads ({self.num_heads}), got {self.num_kv_heads}",
    )
    _require(
        self.d_model % self.num_heads == 0,
        "model.num_heads",
        f"must divide d_model ({self.d_model}), got {self.num_heads}",
    )
    _require(0.0 <= self.rope_fraction <= 1.0, "model.rope_fraction", "must lie in [0, 1]")
    _require(self.key_shift >= 0, "model.key_shift", "must be >= 0 (0 = off)")
    _require(self.norm_eps > 0, "model.norm_eps", f"must be > 0, got {self.norm_eps}")
    _one_of(self.dtype, DTYPES, "model.dtype")
    _one_of(self.param_dtype, DTYPES, "model.param_dtype")
    _one_of(self.remat, REMAT_POLICIES, "model.remat")
    _require(self.compressed_rope_base >= 0, "model.compressed_rope_base", "must be >= 0")
    _require(self.yarn_factor >= 1.0, "model.yarn_factor", f"must be >= 1, got {self.yarn_factor}")
    _require(self.yarn_original_len >= 0, "model.yarn_original_len", "must be >= 0 (0 = off)")
    for i, layer in enumerate(self.layers):
      field = f"model.attention[layer {i}]"
      layer.validate(field, self.num_kv_heads, self.head_dim, self.vocab_size)
      if layer.layout == "deepseek_v4":
        _require(self.num_heads % layer.output_groups == 0, f"{field}.output_groups",
                 f"must divide num_heads ({self.num_heads}), got {layer.output_groups}")
      if layer.indexer == "lightning" and layer.topk:
        _require(layer.index_head_dim >= self.rope_dim, f"{field}.index_head_dim",
                 f"must hold the {self.rope_dim} rotating channels, got {layer.index_head_dim}")
    if self.scan_layers:
      self._validate_scan()

  def _validate_scan(self) -> None:
    # One traced unit serves every scanned repetition, so no layer may behave differently from
    # the same position of another repetition (owners of shared boundaries run unscanned).
    period = self.pattern_period
    _require(self.num_layers % period == 0, "model.scan_layers",
             f"num_layers {self.num_layers} is not a multiple of the layer_pattern period "
             f"{period}; scan needs whole repetitions")
    for i, layer in enumerate(self.layers):
      field = f"model.attention[layer {i}]"
      _require(layer.stagger != "layers" or layer.kind != "fixed", f"{field}.stagger",
               "stagger='layers' gives every layer its own chunk offset; set "
               "model.scan_layers=False")
      _require(layer.kind != "dynamic" or layer.boundary_group == 0, f"{field}.boundary_group",
               "boundary groups give layers different boundary owners; scanned layers need "
               "boundary_group=0 (all layers share) or model.scan_layers=False")


def _parse_bool(text: str) -> bool:
  lowered = text.strip().lower()
  if lowered in ("true", "1", "yes"):
    return True
  if lowered in ("false", "0", "no"):
    return False
  raise ValueError(f"not a boolean: {text!r}")


def _resolve_layer_pattern(
    base: AttentionConfig, pattern: str, num_layers: int
) -> tuple[AttentionConfig, ...]:
  if not pattern.strip():
    return (base,) * num_layers
  fields = {f.name: f for f in dataclasses.fields(AttentionConfig)}
  specs = []
  for spec in pattern.split(";"):
    overrides = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
      key, sep, value = item.partition("=")
      key = key.strip()
      _require(bool(sep), "model.layer_pattern", f"expected field=value, got {item!r}")
      _require(key in fields, "model.layer_pattern",
               f"unknown attention field {key!r}; known: {', '.join(fields)}")
      default = getattr(base, key)
      try:
        if isinstance(default, bool):
          overrides[key] = _parse_bool(value)
        else:
          overrides[key] = type(default)(value.strip())
      except ValueError as e:
        raise ConfigError(f"config field 'model.layer_pattern': {key}={value!r}: {e}") from e
    specs.append(dataclasses.replace(base, **overrides))
  return tuple(specs[i % len(specs)] for i in range(num_layers))


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Offline, deterministic data. Lengths in tokens."""

  task: str = "kv"  # kv (synthetic key-value retrieval) | code (stdlib bytes) | corpus (shards)
  seq_len: int = 256  # T tokens per row
  batch_size: int = 32  # global rows per step (split over processes)
  # Key-value retrieval.
  num_pairs: int = 16  # key-value pairs planted per row
  key_len: int = 1  # tokens per key
  value_len: int = 1  # tokens per value
  num_queries: int = 4  # queries at the end of each row (training signal)
  num_symbols: int = 64  # distinct key/value symbol tokens
  num_filler: int = 4  # distinct filler tokens in the kv haystack
  near_distance: int = 64  # a needle within this many tokens of its query counts as near
  # Code corpus.
  code_needles: int = 0  # key-value needles planted into each row (code, or corpus of bytes)
  heldout_fraction: float = 0.1  # fraction of stdlib files (by path hash) held out
  # Ingested corpus (task "corpus", chunkformer/data/corpus.py).
  path: str = ""  # directory written by chunkformer.data.ingest, or "builtin:stdlib"
  tokenizer: str = ""  # must hash like the shards' ("" = theirs); builtin: "bytes" | "bpe:N"
  read_threads: int = 2  # Grain threads reading and decoding documents

  def validate(self) -> None:
    _one_of(self.task, TASKS, "data.task")
    _require_positive(self, ("seq_len", "batch_size", "num_pairs", "key_len", "value_len",
                             "num_queries", "num_symbols"), "data")
    _require(self.num_queries <= self.num_pairs, "data.num_queries",
             f"must be <= num_pairs ({self.num_pairs}), got {self.num_queries}")
    _require(0.0 < self.heldout_fraction < 1.0, "data.heldout_fraction", "must lie in (0, 1)")
    _require(self.code_needles >= 0, "data.code_needles", "must be >= 0")
    _require(self.num_filler >= 1, "data.num_filler", f"must be >= 1, got {self.num_filler}")
    _require(self.near_distance >= 0, "data.near_distance", "must be >= 0")
    _require(self.read_threads >= 0, "data.read_threads", "must be >= 0")
    from chunkformer import data  # lazy: chunkformer.data imports this module

    data.check_config(self)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Optimisation and bookkeeping. Counts in steps unless stated."""

  steps: int = 1000
  learning_rate: float = 1e-3  # peak, after linear warmup
  warmup_steps: int = 100
  min_lr_ratio: float = 0.1  # cosine decays to learning_rate * min_lr_ratio
  weight_decay: float = 0.01
  grad_clip: float = 1.0  # global-norm clip
  b1: float = 0.9
  b2: float = 0.95
  log_every: int = 50
  eval_every: int = 200
  eval_batches: int = 4  # held-out batches per evaluation
  checkpoint_every: int = 200
  keep_checkpoints: int = 3
  grad_accum_steps: int = 1  # micro-batches per update; data.batch_size is the whole update
  peak_tflops: float = 0.0  # per-device peak for MFU; 0 = device table (chunkformer/flops.py)

  def validate(self) -> None:
    _require(self.steps >= 0, "train.steps", f"must be >= 0, got {self.steps}")
    _require(self.learning_rate > 0, "train.learning_rate", "must be > 0")
    _require(0 <= self.warmup_steps, "train.warmup_steps", "must be >= 0")
    _require(0.0 <= self.min_lr_ratio <= 1.0, "train.min_lr_ratio", "must lie in [0, 1]")
    _require_positive(self, ("log_every", "eval_every", "eval_batches", "checkpoint_every",
                             "keep_checkpoints", "grad_accum_steps"), "train")
    _require(self.peak_tflops >= 0, "train.peak_tflops", "must be >= 0 (0 = device table)")


DEFAULT_AXIS_RULES = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("act_embed", None),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("entries", None),
    ("slots", None),
)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Device mesh. ``data = -1`` (or ``fsdp = -1``) takes every device the other axes leave."""

  data: int = -1
  fsdp: int = 1  # -1: fully sharded data parallel over every device data and tensor leave
  tensor: int = 1
  axis_rules: tuple = DEFAULT_AXIS_RULES  # logical axis -> mesh axes

  def shape(self, device_count: int) -> tuple[int, int, int]:
    """Resolved (data, fsdp, tensor); raises ConfigError if it does not match the devices."""
    _require(self.tensor >= 1, "mesh.tensor", "must be >= 1")
    for name in ("data", "fsdp"):
      _require(getattr(self, name) == -1 or getattr(self, name) >= 1, f"mesh.{name}",
               "must be >= 1 or -1 (auto)")
    _require(self.data != -1 or self.fsdp != -1, "mesh.fsdp",
             "only one of mesh.data and mesh.fsdp may be -1 (auto)")
    data, fsdp = self.data, self.fsdp
    if -1 in (data, fsdp):
      rest = self.tensor * (fsdp if data == -1 else data)
      _require(device_count % rest == 0, "mesh",
               f"the fixed mesh axes ({rest} devices) do not divide the {device_count} devices")
      data, fsdp = (device_count // rest, fsdp) if data == -1 else (data, device_count // rest)
    total = data * fsdp * self.tensor
    _require(total == device_count, "mesh",
             f"data*fsdp*tensor = {data}*{fsdp}*{self.tensor} = {total} "
             f"does not match the {device_count} devices")
    return data, fsdp, self.tensor


@dataclasses.dataclass(frozen=True)
class InitConfig:
  """Where a fresh run's parameters come from (chunkformer/warm_start.py)."""

  from_workdir: str = ""  # run directory (e.g. an imported Qwen3) whose newest checkpoint's
  # params start this run; weights the new config adds (compressors) are freshly initialised
  train_only_new_steps: int = 0  # the first N updates train only the newly initialised weights

  def validate(self) -> None:
    _require(self.train_only_new_steps >= 0, "init.train_only_new_steps", "must be >= 0")
    _require(bool(self.from_workdir) or not self.train_only_new_steps,
             "init.train_only_new_steps", "needs init.from_workdir (no weights are new otherwise)")


@dataclasses.dataclass(frozen=True)
class Config:
  seed: int = 0
  model: ModelConfig = ModelConfig()
  data: DataConfig = DataConfig()
  train: TrainConfig = TrainConfig()
  mesh: MeshConfig = MeshConfig()
  init: InitConfig = InitConfig()

  def validate(self) -> Config:
    self.model.validate()
    self.data.validate()
    self.train.validate()
    self.init.validate()
    accum = self.train.grad_accum_steps
    _require(self.data.batch_size % accum == 0, "train.grad_accum_steps",
             f"{accum} micro-batches do not divide data.batch_size={self.data.batch_size}")
    from chunkformer import data  # lazy: chunkformer.data imports this module

    for i, layer in enumerate(self.model.layers):
      if layer.kind == "dynamic" and layer.entry_capacity:
        rows = -(-self.data.seq_len // layer.shortest_chunk)
        _require(layer.entry_capacity >= rows, f"model.attention[layer {i}].entry_capacity",
                 f"{layer.entry_capacity} entries cannot hold the {rows} chunks of at least "
                 f"{layer.shortest_chunk} tokens that a row of data.seq_len={self.data.seq_len} "
                 "may close")
    for i, layer in enumerate(self.model.layers):
      if layer.kind == "fixed" and layer.topk:
        capacity = -(-self.data.seq_len // layer.chunk_size)  # fixed entries per row
        _require(layer.topk <= capacity, f"model.attention[layer {i}].topk",
                 f"top-{layer.topk} exceeds the {capacity} entries of a row "
                 f"(data.seq_len={self.data.seq_len}, chunk_size={layer.chunk_size})")
    needed = data.vocab_size_needed(self.data)
    _require(self.model.vocab_size >= needed, "model.vocab_size",
             f"data task {self.data.task!r} emits token ids up to {needed - 1}; "
             f"need >= {needed}, got {self.model.vocab_size}")
    return self


def _deep_tuple(value: Any) -> Any:
  """Lists back to tuples at every depth (JSON and ConfigDict turn tuples into lists)."""
  return tuple(_deep_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


def _build(cls, values: Mapping[str, Any], prefix: str):
  known = {f.name: f for f in dataclasses.fields(cls)}
  kwargs = {}
  for key, value in values.items():
    field = f"{prefix}{key}"
    if key not in known:
      raise ConfigError(f"config field '{field}' is unknown; known: {', '.join(known)}")
    default = known[key].default
    if dataclasses.is_dataclass(default):
      kwargs[key] = _build(type(default), value, f"{field}.")
    elif isinstance(default, tuple):
      kwargs[key] = _deep_tuple(value)
    else:
      kwargs[key] = value
  return cls(**kwargs)


def from_dict(values: Mapping[str, Any]) -> Config:
  """Builds and validates a Config from a nested mapping (e.g. ``ConfigDict.to_dict()``)."""
  return _build(Config, values, "").validate()


def to_dict(config: Config) -> dict[str, Any]:
  return dataclasses.asdict(config)
