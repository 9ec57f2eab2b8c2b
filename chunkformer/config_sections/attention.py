"""One layer's attention (``model.attention``, and per layer through ``model.layer_pattern``)."""

from __future__ import annotations

import dataclasses

from chunkformer.config_sections import capabilities
from chunkformer.config_sections.errors import ConfigError, one_of, require

ATTENTION_KINDS = capabilities.KINDS  # full | window | fixed | dynamic
POOLINGS = ("gated", "gated_no_bias", "mean", "mlp")
GATES = ("vector", "scalar")  # gated pooling: one score per channel | one per offset and token
WINDOW_ALIGNS = ("end", "start")  # compressor windows end at chunk ends | start on the S grid
OFFSET_MAPS = ("shared", "per_offset")  # payload/gate maps: one (per overlap half) | one per offset
ENTRY_NORMS = ("all", "keys", "none")  # RMSNorm of pooled entries: key and value | key | none
BOUNDARY_PREDICTORS = ("router", "delimiter", "fixed")
ROUTER_RULES = ("start", "end")
STAGGER_MODES = ("none", "layers", "heads")
LAYOUTS = ("qwen3", "deepseek_v4")
INDEXERS = ("simple", "lightning")
# Which implementation serves which kind and option: config_sections/capabilities.py (one table).
IMPLEMENTATION_CHOICES = capabilities.CHOICES


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
  """One layer's attention. Fields irrelevant to ``kind`` are ignored by that kind."""

  kind: str = "full"  # full | window (sliding window only) | fixed | dynamic
  window: int = 0  # raw-token sliding window W in tokens; 0 = no raw tokens besides entries
  chunk_size: int = 4  # M: tokens pooled into one entry (dynamic: target mean chunk length)
  pooling: str = "gated"  # gated | gated_no_bias | mean | mlp
  overlap: bool = False  # DeepSeek CSA: each entry pools 2M slots across two chunks
  # The compressor's window (kind fixed): an entry pools the W tokens ending at its chunk's last
  # token, one entry every chunk_size = S tokens (the stride). 0 = S, or 2S with overlap
  # (CSA is W = 2S with one map per half).
  compress_window: int = 0
  # Where the windows sit (kind fixed): "end" = entry j pools [(j+1)S - W, (j+1)S), windows
  # reaching before the row start padded (DeepSeek-V4's CSA; every run written before this
  # field); "start" = the paper's entry j pools [jS, jS + W), i.e. the "end" grid shifted by
  # W mod S, and an entry whose window begins before its document (or the row) starts is
  # never visible. Either way an entry is visible from its last token on.
  compress_window_align: str = "end"
  offset_maps: str = "shared"  # shared | per_offset: each offset i its own payload/gate map
  gate: str = "vector"  # vector (one score per channel, DeepSeek-V4) | scalar (one per offset)
  payload_norm: bool = False  # RMSNorm of every token's payload after its map (post-norm)
  entry_norm: str = "all"  # all | keys | none: which pooled entries get an RMSNorm
  tail: bool = False  # raw tokens: only the current incomplete chunk (needs window = 0)
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
  implementation: str = "xla"  # xla | pallas_gpu | pallas_tpu | blockwise | splash | auto
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
    one_of(self.kind, ATTENTION_KINDS, f"{field}.kind")
    one_of(self.pooling, POOLINGS, f"{field}.pooling")
    one_of(self.stagger, STAGGER_MODES, f"{field}.stagger")
    one_of(self.boundary, BOUNDARY_PREDICTORS, f"{field}.boundary")
    one_of(self.router_rule, ROUTER_RULES, f"{field}.router_rule")
    one_of(self.implementation, IMPLEMENTATION_CHOICES, f"{field}.implementation")
    one_of(self.layout, LAYOUTS, f"{field}.layout")
    one_of(self.indexer, INDEXERS, f"{field}.indexer")
    one_of(self.gate, GATES, f"{field}.gate")
    one_of(self.offset_maps, OFFSET_MAPS, f"{field}.offset_maps")
    one_of(self.compress_window_align, WINDOW_ALIGNS, f"{field}.compress_window_align")
    one_of(self.entry_norm, ENTRY_NORMS, f"{field}.entry_norm")
    self._validate_compressor_window(field, num_kv_heads)
    if self.layout == "deepseek_v4":
      require(self.kind in ("window", "fixed", "dynamic"), f"{field}.layout",
              f"'deepseek_v4' serves kinds window, fixed and dynamic, not {self.kind!r}")
      for name in ("query_rank", "output_rank", "output_groups"):
        require(getattr(self, name) >= 1, f"{field}.{name}", "must be >= 1")
    if self.indexer == "lightning" and self.topk:
      require(self.layout == "deepseek_v4", f"{field}.indexer",
              "the lightning indexer reads the low-rank query: needs layout 'deepseek_v4'")
      for name in ("index_heads", "index_head_dim"):
        require(getattr(self, name) >= 1, f"{field}.{name}", "must be >= 1")
      require(self.stagger != "heads" or num_kv_heads == 1, f"{field}.stagger",
              "the lightning indexer's entries follow one chunking shared by the kv heads")
      require(self.index_head_dim % 2 == 0, f"{field}.index_head_dim",
              f"must be even (overlap halves, RoPE pairs), got {self.index_head_dim}")
      require(self.indexer_loss_weight >= 0, f"{field}.indexer_loss_weight", "must be >= 0")
    require(self.window >= 0, f"{field}.window", f"must be >= 0, got {self.window}")
    require(self.chunk_size >= 1, f"{field}.chunk_size", f"must be >= 1, got {self.chunk_size}")
    require(self.topk >= 0, f"{field}.topk", f"must be >= 0, got {self.topk}")
    require(self.chunk_offset >= 0, f"{field}.chunk_offset", "must be >= 0")
    if self.kind == "window":
      require(self.window >= 1, f"{field}.window", "kind 'window' needs window >= 1")
    if self.overlap and self.kind in ("fixed", "dynamic"):
      require(
          head_dim % 2 == 0,
          f"{field}.overlap",
          f"overlap splits the entry channels in two halves; head_dim {head_dim} is odd",
      )
    if self.kind == "dynamic":
      require(self.min_chunk >= 1, f"{field}.min_chunk", "must be >= 1")
      require(
          self.max_chunk >= self.min_chunk,
          f"{field}.max_chunk",
          f"must be >= min_chunk ({self.min_chunk}), got {self.max_chunk}",
      )
      if self.boundary != "fixed":  # fixed boundaries ignore min/max: every chunk has M tokens
        require(
            self.min_chunk <= self.chunk_size <= self.max_chunk,
            f"{field}.chunk_size",
            f"target chunk length {self.chunk_size} must lie in "
            f"[min_chunk={self.min_chunk}, max_chunk={self.max_chunk}]",
        )
      if self.boundary == "router":
        require(self.chunk_size >= 2, f"{field}.chunk_size",
                "the router's ratio loss N/(N-1)(...) needs a target chunk length >= 2")
      require(self.pooling in ("gated", "gated_no_bias", "mean"), f"{field}.pooling",
              f"kind 'dynamic' pools variable chunks with gated | gated_no_bias | mean, "
              f"got {self.pooling!r}")
      for name in ("overlap", "random_phase"):
        require(not getattr(self, name), f"{field}.{name}",
                "not supported by kind 'dynamic' (a fixed-kind option)")
      require(self.topk == 0, f"{field}.topk", "not supported by kind 'dynamic'")
      require(self.stagger == "none", f"{field}.stagger",
              "not supported by kind 'dynamic' (a fixed-kind option)")
      require(self.entry_capacity >= 0, f"{field}.entry_capacity", "must be >= 0 (0 = auto)")
      require(
          self.capacity_multiple in (1, 8, 16, 128),
          f"{field}.capacity_multiple",
          f"got {self.capacity_multiple}, allowed: 1, 8, 16, 128",
      )
      for token in self.delimiter_ids:
        require(
            0 <= token < vocab_size,
            f"{field}.delimiters",
            f"token id {token} outside the vocabulary [0, {vocab_size})",
        )
      if self.boundary == "delimiter":
        require(bool(self.delimiter_ids), f"{field}.delimiters", "delimiter rule needs ids")
    refused = capabilities.refusal(self, num_kv_heads)
    if refused is not None:
      require(False, f"{field}.{refused[0]}", refused[1])

  def _validate_compressor_window(self, field: str, num_kv_heads: int) -> None:
    s = self.chunk_size
    require(self.compress_window >= 0, f"{field}.compress_window",
            f"the window W must be >= 1 (0 = chunk_size), got {self.compress_window}")
    if self.compress_window:
      require(self.compress_window >= s, f"{field}.compress_window",
              f"the window W = {self.compress_window} must be >= the stride chunk_size = {s}")
      require(not self.overlap or self.compress_window == 2 * s, f"{field}.compress_window",
              f"overlap is W = 2 * chunk_size = {2 * s}, got {self.compress_window}")
    general = (self.compress_window, self.compress_window_align != "end",
               self.offset_maps != "shared", self.gate != "vector", self.payload_norm, self.tail)
    if self.kind == "dynamic" and any(general):
      names = ("compress_window", "compress_window_align", "offset_maps", "gate",
               "payload_norm", "tail")
      bad = next(n for n, on in zip(names, general, strict=True) if on)
      require(False, f"{field}.{bad}", "a fixed-kind compressor option, not for kind 'dynamic'")
    if self.tail:
      require(self.window == 0, f"{field}.tail",
              f"the uncompressed tail replaces the fixed local window; set window = 0, "
              f"got window = {self.window}")
      require(self.stagger != "heads" or num_kv_heads == 1, f"{field}.tail",
              "the tail follows one chunking shared by the kv heads (stagger 'heads' differs)")

  @property
  def stride(self) -> int:
    """S: tokens between consecutive entries of the fixed kind (chunk_size)."""
    return self.chunk_size

  @property
  def window_tokens(self) -> int:
    """W: tokens one fixed-kind entry pools (the last S of them are its own chunk)."""
    return self.compress_window or self.chunk_size * (2 if self.overlap else 1)

  @property
  def align_offset(self) -> int:
    """Left shift of the chunk grid that puts window starts on multiples of S ("start")."""
    if self.compress_window_align == "start":
      return -self.window_tokens % self.chunk_size
    return 0

  @property
  def entry_position_lag(self) -> int:
    """Tokens from an entry's RoPE position back from its last token: the entry sits at its
    chunk's first token ("end": S - 1 back) or at its window's first token ("start": W - 1)."""
    if self.compress_window_align == "start":
      return self.window_tokens - 1
    return self.chunk_size - 1

  @property
  def tail_span(self) -> int:
    """Most raw tokens the uncompressed tail can hold: its own chunk (S), or under "start"
    alignment every token before a document's first full window (up to W + S - 2)."""
    if self.compress_window_align == "start":
      return max(self.chunk_size, self.window_tokens + self.chunk_size - 2)
    return self.chunk_size

  @property
  def map_groups(self) -> int:
    """G: distinct payload/gate maps over the W offsets, each serving W/G consecutive offsets."""
    if self.offset_maps == "per_offset":
      return self.window_tokens
    return 2 if self.overlap else 1

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
