"""The decoder (``model``): widths, RoPE, dtypes, remat and scan, and each layer's attention."""

from __future__ import annotations

import dataclasses

from chunkformer.config_sections import layer_pattern as layer_pattern_lib
from chunkformer.config_sections.attention import AttentionConfig
from chunkformer.config_sections.errors import one_of, require, require_positive

DTYPES = ("float32", "bfloat16")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")  # chunkformer/layer_stack.py


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
  rope_dims: int = 0  # rotating channels per head, even, <= head_dim; 0 = from rope_fraction
  rope_base: float = 10000.0
  qk_norm: bool = True  # RMSNorm per head on queries and keys (Qwen3)
  norm_eps: float = 1e-6  # epsilon of the block, final and QK RMSNorms (Qwen3's rms_norm_eps)
  tie_embeddings: bool = True
  scale_tied_logits: bool = True  # tied head: logits / sqrt(d_model) (unit-scale embeddings);
  # False = plain x E^T, as Hugging Face Qwen3 (set by chunkformer/convert/qwen3.py)
  key_shift: int = 0  # width of a causal conv mixing x_{t-w+1..t} into keys; 0 = off
  value_shift: bool = False  # apply the same token shift to values
  query_shift: bool = False  # and to queries (a query then sees its predecessors too)
  dtype: str = "float32"  # activation dtype
  # RoPE of compressed layers (kinds fixed, dynamic), as DeepSeek-V4: own base, YaRN.
  compressed_rope_base: float = 0.0  # 0 = rope_base (DeepSeek-V4: 160000)
  yarn_factor: float = 1.0  # YaRN context extension factor on compressed layers; 1 = off
  yarn_original_len: int = 0  # tokens the compressed base was trained for; 0 = no YaRN
  yarn_beta_fast: float = 32.0  # YaRN ramp bounds (rotations), as the reference
  yarn_beta_slow: float = 1.0
  param_dtype: str = "float32"  # parameter and optimiser-state dtype
  remat: str = "none"  # none | full | dots | dots_no_batch: jax.checkpoint policy per block
  scan_layers: bool = False  # nn.scan over the repeating unit of layer_pattern (layer_stack.py)
  # Cross-entropy over tiles of this many tokens (chunkformer/loss_tiles.py), never holding
  # B x T x V float32 logits; 0 = the plain head; -1 = auto: tiles of 512 when vocab_size x T
  # >= 2**27 (one row's float32 logits >= 512 MiB), else the plain head.
  loss_token_tile: int = -1
  attention: AttentionConfig = AttentionConfig()
  layer_pattern: str = ""  # per-layer attention overrides; syntax in layer_pattern.py

  @property
  def rope_dim(self) -> int:
    """Rotating channels per head (even)."""
    if not self.rope:
      return 0
    if self.rope_dims:
      return self.rope_dims
    return int(round(self.head_dim * self.rope_fraction / 2)) * 2

  def layer_attention(self, layer: int) -> AttentionConfig:
    return self.layers[layer]

  @property
  def layers(self) -> tuple[AttentionConfig, ...]:
    return layer_pattern_lib.resolve(self.attention, self.layer_pattern, self.num_layers)

  @property
  def pattern_period(self) -> int:
    """Layers in one repetition of ``layer_pattern`` (1 without a pattern)."""
    return len(self.layer_pattern.split(";")) if self.layer_pattern.strip() else 1

  def validate(self) -> None:
    require_positive(self, ("vocab_size", "num_layers", "d_model", "num_heads", "num_kv_heads",
                            "head_dim", "mlp_dim"), "model")
    require(
        self.num_heads % self.num_kv_heads == 0,
        "model.num_kv_heads",
        f"must divide num_heads ({self.num_heads}), got {self.num_kv_heads}",
    )
    require(
        self.d_model % self.num_heads == 0,
        "model.num_heads",
        f"must divide d_model ({self.d_model}), got {self.num_heads}",
    )
    require(0.0 <= self.rope_fraction <= 1.0, "model.rope_fraction", "must lie in [0, 1]")
    require(self.rope_dims >= 0 and self.rope_dims % 2 == 0, "model.rope_dims",
            f"RoPE rotates channel pairs: must be even and >= 0, got {self.rope_dims}")
    require(self.rope_dims <= self.head_dim, "model.rope_dims",
            f"must be <= head_dim ({self.head_dim}), got {self.rope_dims}")
    require(self.key_shift >= 0, "model.key_shift", "must be >= 0 (0 = off)")
    require(not self.query_shift or self.key_shift > 1, "model.query_shift",
            f"uses the width of model.key_shift, which must be >= 2; got {self.key_shift}")
    require(self.norm_eps > 0, "model.norm_eps", f"must be > 0, got {self.norm_eps}")
    require(self.loss_token_tile >= -1, "model.loss_token_tile",
            f"tokens per loss tile: >= 1, 0 = untiled, -1 = auto; got {self.loss_token_tile}")
    one_of(self.dtype, DTYPES, "model.dtype")
    one_of(self.param_dtype, DTYPES, "model.param_dtype")
    one_of(self.remat, REMAT_POLICIES, "model.remat")
    require(self.compressed_rope_base >= 0, "model.compressed_rope_base", "must be >= 0")
    require(self.yarn_factor >= 1.0, "model.yarn_factor", f"must be >= 1, got {self.yarn_factor}")
    require(self.yarn_original_len >= 0, "model.yarn_original_len", "must be >= 0 (0 = off)")
    for i, layer in enumerate(self.layers):
      field = f"model.attention[layer {i}]"
      layer.validate(field, self.num_kv_heads, self.head_dim, self.vocab_size)
      if layer.layout == "deepseek_v4":
        require(self.num_heads % layer.output_groups == 0, f"{field}.output_groups",
                f"must divide num_heads ({self.num_heads}), got {layer.output_groups}")
      if layer.indexer == "lightning" and layer.topk:
        require(layer.index_head_dim >= self.rope_dim, f"{field}.index_head_dim",
                f"must hold the {self.rope_dim} rotating channels, got {layer.index_head_dim}")
    if self.scan_layers:
      self._validate_scan()

  def _validate_scan(self) -> None:
    # One traced unit serves every scanned repetition, so no layer may behave differently from
    # the same position of another repetition (owners of shared boundaries run unscanned).
    period = self.pattern_period
    require(self.num_layers % period == 0, "model.scan_layers",
            f"num_layers {self.num_layers} is not a multiple of the layer_pattern period "
            f"{period}; scan needs whole repetitions")
    for i, layer in enumerate(self.layers):
      field = f"model.attention[layer {i}]"
      require(layer.stagger != "layers" or layer.kind != "fixed", f"{field}.stagger",
              "stagger='layers' gives every layer its own chunk offset; set "
              "model.scan_layers=False")
      require(layer.kind != "dynamic" or layer.boundary_group == 0, f"{field}.boundary_group",
              "boundary groups give layers different boundary owners; scanned layers need "
              "boundary_group=0 (all layers share) or model.scan_layers=False")
