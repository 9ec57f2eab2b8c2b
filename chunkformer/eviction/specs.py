"""The eviction policies as frozen, validated settings: what a prefill or a sweep config names.

``SnapKV(budget=128)`` etc. Budgets are a token count (int >= 1) or a share of the prompt
(float in (0, 1], rounded to the nearest token). Bad settings raise ConfigError naming the
field (``eviction.<policy>.<field>``) when the policy is made, or, for what depends on the
prompt (a budget larger than the prompt, a window larger than a ratio budget), when a prompt
length resolves it, before any forward pass. Policies are pytrees whose settings are static,
so a jitted prefill compiles once per policy.

Every policy gives ``select(layers, tokens_BxT, lengths_B, n)`` -> kept_BxKxN per layer
(``policies.py``); ``queries(prompt_len)`` is how many of the prompt's last queries it reads.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from chunkformer.config_sections.errors import ConfigError, one_of, require
from chunkformer.eviction import chunk_spans, policies, scores, select

Array = jax.Array


class LayerInputs(NamedTuple):
  """One full-attention layer's prompt cache and the queries a policy reads."""

  keys_BxTxKxD: Array
  values_BxTxKxD: Array
  queries_BxWxHxD: Array


def _static(default: Any = dataclasses.MISSING):
  return dataclasses.field(default=default, metadata=dict(static=True))


@dataclasses.dataclass(frozen=True)
class Policy:
  """What every policy shares: the budget, its resolution and validation."""

  name = "policy"
  budget: int | float = _static()

  def __post_init__(self):
    b = self.budget
    ok = (isinstance(b, int) and not isinstance(b, bool) and b >= 1) or (
        isinstance(b, float) and 0.0 < b <= 1.0)
    require(ok, self.field("budget"), f"give a token count >= 1 or a share of the prompt in "
            f"(0, 1], got {b!r}")
    self.check()

  def field(self, name: str) -> str:
    return f"eviction.{self.name}.{name}"

  def check(self) -> None:
    """Policy-specific checks of the settings alone."""

  def kept_always(self) -> int:
    """Tokens the policy keeps whatever the scores (a window, sinks)."""
    return 0

  def tokens(self, prompt_len: int) -> int:
    """The budget in tokens for a prompt of ``prompt_len``; ConfigError if it cannot hold."""
    n = self.budget if isinstance(self.budget, int) else max(1, round(self.budget * prompt_len))
    require(n <= prompt_len, self.field("budget"),
            f"{n} tokens exceed the prompt of {prompt_len} tokens")
    require(self.kept_always() <= n, self.field("budget"),
            f"{n} tokens cannot hold the {self.kept_always()} tokens the policy always keeps")
    return n

  def queries(self, prompt_len: int) -> int:
    """How many of the prompt's last queries the policy reads (0: none)."""
    del prompt_len
    return 0

  def select(self, layers: Sequence[LayerInputs], tokens_BxT: Array, lengths_B: Array,
             n: int) -> list[Array]:
    """kept_BxKxN of every layer (each layer on its own)."""
    del tokens_BxT
    return [self.one_layer(layer, lengths_B, n) for layer in layers]

  def one_layer(self, layer: LayerInputs, lengths_B: Array, n: int) -> Array:
    raise NotImplementedError


def _check_window(policy, name: str, value: int, minimum: int) -> None:
  require(isinstance(value, int) and value >= minimum, policy.field(name),
          f"must be an int >= {minimum}, got {value!r}")
  if isinstance(policy.budget, int):
    require(value <= policy.budget, policy.field(name),
            f"{value} tokens exceed the budget of {policy.budget}")


def _check_pooling(policy) -> None:
  require(isinstance(policy.kernel, int) and policy.kernel >= 1 and policy.kernel % 2 == 1,
          policy.field("kernel"), f"must be an odd int >= 1, got {policy.kernel!r}")
  one_of(policy.pooling, scores.POOLINGS, policy.field("pooling"))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StreamingLLM(Policy):
  """Attention sinks (the first ``sinks`` tokens) and the most recent tokens."""

  name = "streaming_llm"
  sinks: int = _static(4)

  def check(self):
    _check_window(self, "sinks", self.sinks, 0)

  def kept_always(self):
    return self.sinks

  def one_layer(self, layer, lengths_B, n):
    return policies.streaming_llm(*layer, n, lengths_B, sinks=self.sinks)


# kvpress's SnapKVPress settings (window 64, kernel 5, average pooling). This repository's
# SnapKV defaults to window 32, kernel 7, max pooling, and the eviction sweep sets window 8;
# ``SnapKV(budget, **KVPRESS_SNAPKV)`` selects kvpress's.
KVPRESS_SNAPKV = {"window": 64, "kernel": 5, "pooling": "avg"}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SnapKV(Policy):
  """SnapKV: observation window of the last ``window`` queries, ``pooling`` over ``kernel``
  (defaults 32, 7, max; kvpress's are ``KVPRESS_SNAPKV``)."""

  name = "snapkv"
  window: int = _static(32)
  kernel: int = _static(7)
  pooling: str = _static("max")

  def check(self):
    _check_window(self, "window", self.window, 1)
    _check_pooling(self)

  def kept_always(self):
    return self.window

  def queries(self, prompt_len):
    return self.window

  def one_layer(self, layer, lengths_B, n):
    return policies.snapkv(*layer, n, lengths_B, kernel=self.kernel, pooling=self.pooling)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class H2O(Policy):
  """Heavy hitters by attention accumulated over every prompt query, plus ``recent`` tokens."""

  name = "h2o"
  recent: int = _static(32)

  def check(self):
    _check_window(self, "recent", self.recent, 0)

  def kept_always(self):
    return self.recent

  def queries(self, prompt_len):
    return prompt_len

  def one_layer(self, layer, lengths_B, n):
    return policies.h2o(*layer, n, lengths_B, recent=self.recent)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KNorm(Policy):
  """The keys of smallest L2 norm."""

  name = "knorm"

  def one_layer(self, layer, lengths_B, n):
    return policies.knorm(*layer, n, lengths_B)


@dataclasses.dataclass(frozen=True)
class _Chunked(Policy):
  """ChunkKV's settings and its layer-wise index reuse; subclasses say where chunks close
  (``ends``). ``select`` here fills the budget exactly, cutting a chunk (``chunkkv_cut``)."""

  window: int = _static(32)
  kernel: int = _static(7)
  pooling: str = _static("max")
  # consecutive layers sharing one selection (the group's first layer chooses): ChunkKV's
  # layer-wise index reuse; 1 = every layer chooses
  layer_reuse: int = _static(1)

  def check(self):
    _check_window(self, "window", self.window, 1)
    _check_pooling(self)
    require(isinstance(self.layer_reuse, int) and self.layer_reuse >= 1,
            self.field("layer_reuse"), f"must be an int >= 1, got {self.layer_reuse!r}")

  def kept_always(self):
    return self.window

  def queries(self, prompt_len):
    return self.window

  def ends(self, tokens_BxT: Array) -> Array:
    raise NotImplementedError

  def select(self, layers, tokens_BxT, lengths_B, n):
    ends_BxT = self.ends(tokens_BxT)
    kept = []
    for index, layer in enumerate(layers):
      if index % self.layer_reuse:
        kept.append(kept[-1])
        continue
      kept.append(policies.chunkkv_cut(*layer, n, lengths_B, ends_BxT=ends_BxT,
                                       kernel=self.kernel, pooling=self.pooling))
    return kept


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ChunkKV(_Chunked):
  """ChunkKV as published (its paper; kvpress's ChunkKVPress over SnapKV): whole chunks only,
  a grid of ``chunk`` tokens from position 0 over the whole prompt (``policies.chunkkv``); the
  budget is rounded down to the prompt's last chunk plus whole chunks, so it keeps up to
  ``chunk - 1`` tokens fewer than the budget (``ChunkKVCut`` fills it exactly)."""

  name = "chunkkv"
  chunk: int = _static(10)

  def check(self):
    super().check()
    require(isinstance(self.chunk, int) and self.chunk >= 1, self.field("chunk"),
            f"must be an int >= 1, got {self.chunk!r}")

  def ends(self, tokens_BxT):
    return jnp.broadcast_to(select.grid_ends(tokens_BxT.shape[1], self.chunk), tokens_BxT.shape)

  def _cover(self, prompt_len: int) -> int:
    """Tokens of the chunks that hold the observation window (kept first)."""
    last = prompt_len % self.chunk
    return last + self.chunk * -(-max(0, self.window - last) // self.chunk)

  def tokens(self, prompt_len: int) -> int:
    n = super().tokens(prompt_len)
    last = prompt_len % self.chunk
    kept = last + self.chunk * ((n - last) // self.chunk) if n >= last else 0
    require(kept >= max(1, self._cover(prompt_len)), self.field("budget"),
            f"{n} tokens rounded down to whole chunks of {self.chunk} ({kept}) cannot hold the "
            f"{self._cover(prompt_len)} tokens of the chunks holding the {self.window}-token "
            f"window (prompt of {prompt_len})")
    return kept

  def select(self, layers, tokens_BxT, lengths_B, n):
    del tokens_BxT
    kept = []
    for index, layer in enumerate(layers):
      if index % self.layer_reuse:
        kept.append(kept[-1])
        continue
      kept.append(policies.chunkkv(*layer, n, lengths_B, chunk=self.chunk, kernel=self.kernel,
                                   pooling=self.pooling))
    return kept


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ChunkKVCut(ChunkKV):
  """ChunkKV with a cut chunk, not the published method: the same settings and grid, but over
  the prefix before the observation window (kept outside it), the budget filled exactly by
  keeping the first tokens of the first chunk that does not fit (``policies.chunkkv_cut``).
  The committed eviction sweep's first run used it (then under the name ``chunkkv``)."""

  name = "chunkkv_cut"

  def tokens(self, prompt_len: int) -> int:
    return Policy.tokens(self, prompt_len)  # exact: no rounding to whole chunks

  def select(self, layers, tokens_BxT, lengths_B, n):
    return _Chunked.select(self, layers, tokens_BxT, lengths_B, n)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ContentChunkKV(_Chunked):
  """ChunkKV with chunks from a boundary predictor (``boundaries.Delimiter`` or ``Router``)."""

  name = "content_chunkkv"
  boundaries: Any = None

  def check(self):
    super().check()
    require(isinstance(self.boundaries, (chunk_spans.Delimiter, chunk_spans.Router)),
            self.field("boundaries"), f"give a Delimiter or a Router, got {self.boundaries!r}")

  def ends(self, tokens_BxT):
    return self.boundaries.ends(tokens_BxT)


POLICIES: dict[str, type[Policy]] = {cls.name: cls for cls in (
    StreamingLLM, SnapKV, H2O, KNorm, ChunkKV, ChunkKVCut, ContentChunkKV)}


def from_dict(spec: dict[str, Any], field: str = "eviction") -> Policy:
  """A policy from a config entry: ``{"policy": "snapkv", "budget": 64, "window": 8}``;
  content chunks by delimiter: ``"delimiters": [ids], "min_chunk": .., "max_chunk": ..``."""
  spec = dict(spec)
  name = spec.pop("policy", None)
  require(name in POLICIES, f"{field}.policy",
          f"got {name!r}, allowed: {', '.join(POLICIES)}")
  cls = POLICIES[name]
  if name == "content_chunkkv":
    ids = spec.pop("delimiters", None)
    require(ids is not None, f"{field}.delimiters", "content_chunkkv from a config needs "
            "its delimiter token ids (a trained router is given in code: boundaries.Router)")
    lengths = {k: spec.pop(k) for k in ("min_chunk", "max_chunk") if k in spec}
    spec["boundaries"] = chunk_spans.Delimiter(tuple(ids), **lengths)
  known = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(spec) - known)
  require(not unknown, f"{field}.{unknown[0] if unknown else ''}",
          f"not a setting of {name}; known: {', '.join(sorted(known))}")
  try:
    return cls(**spec)
  except TypeError as e:
    raise ConfigError(f"config field '{field}': {e}") from None


def short_label(label_: str) -> str:
  """``label_`` for reports: a run of four or more consecutive delimiter ids written as its
  ends (``delim39.40.41.42`` -> ``delim39..42``). Display only: records keep the full label."""
  def compact(match: re.Match) -> str:
    ids = [int(x) for x in match.group(1).split(".")]
    runs, start = [], 0
    for i in range(1, len(ids) + 1):
      if i == len(ids) or ids[i] != ids[i - 1] + 1:
        run = ids[start:i]
        runs.append(f"{run[0]}..{run[-1]}" if len(run) >= 4 else ".".join(map(str, run)))
        start = i
    return "delim" + ".".join(runs)

  return re.sub(r"delim(\d+(?:\.\d+)*)", compact, label_)


def label(policy: Policy) -> str:
  """A short stable name, e.g. ``snapkv-b64-w8-k7-max``: the key of a sweep's results."""
  parts = [policy.name, f"b{policy.budget}"]
  for f in dataclasses.fields(policy):
    if f.name in ("budget", "boundaries"):
      continue
    parts.append(f"{f.name}{getattr(policy, f.name)}")
  if isinstance(policy, ContentChunkKV) and isinstance(policy.boundaries,
                                                       chunk_spans.Delimiter):
    b = policy.boundaries
    parts.append(f"delim{'.'.join(map(str, b.ids))}-len{b.min_chunk}-{b.max_chunk}")
  return "-".join(parts)


