"""Which attention implementation serves which layer: THE capability table.

Config validation (``AttentionConfig.validate``, ``Config``'s context check), ``auto``
(``attention.dispatch.resolve``) and the runtime (``attention.dispatch`` before calling a
kernel, ``decode``'s split prefill) all read ``TABLE``, ``OPTIONS`` and ``AUTO``; no other
module states which implementation serves which kind or option. A leaf (imports nothing from
chunkformer) so that the config sections can read it.

Each implementation names one code path per kind it serves (``Capability.paths``):
- ``xla``: plain XLA. Kind full: ``jax.nn.dot_product_attention`` with a dense document-causal
  mask; the compressed kinds: ``compressed_core.compressed_attention`` (window blocks plus T x C
  entry scores, in query blocks under remat when long, ``attention.query_blocks``); decoding:
  ``kernels.decode_attention(implementation="xla")``. The only implementation serving every
  option, so ``auto`` always finds one.
- ``blockwise`` (kind full): online softmax in XLA, no T x T scores (``attention.blockwise``).
- ``splash`` (kind full, TPU): JAX's splash attention (``attention.splash``).
- ``pallas_gpu`` / ``pallas_tpu``: the project's kernels (``kernels.chunk_attention``; kind full
  as a whole-row window with no entries; decoding: ``kernels.decode_attention``). They read one
  end per entry shared by the kv heads and see every visible entry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from kernels.implementation import IMPLEMENTATIONS

COMPRESSED_KINDS = ("window", "fixed", "dynamic")
KINDS = ("full", *COMPRESSED_KINDS)


@dataclasses.dataclass(frozen=True)
class Option:
  """A layer option that not every implementation serves."""

  field: str  # the AttentionConfig field a refusal names
  kinds: tuple[str, ...]  # kinds that read the option (others ignore the field)
  active: Callable[[object, int], bool]  # (AttentionConfig, num_kv_heads) -> in use
  what: str  # what it does, for the refusal


OPTIONS = {
    "topk": Option("topk", COMPRESSED_KINDS, lambda a, kh: a.topk > 0,
                   "the indexer's top-k selection"),
    "tail": Option("tail", COMPRESSED_KINDS, lambda a, kh: a.tail,
                   "the uncompressed tail's raw-token mask"),
    "head_stagger": Option("stagger", COMPRESSED_KINDS,
                           lambda a, kh: a.stagger == "heads" and kh > 1,
                           "per-head chunk offsets (one end per entry and kv head)"),
}


@dataclasses.dataclass(frozen=True)
class Capability:
  """What one implementation serves."""

  kinds: tuple[str, ...]  # attention kinds it runs
  options: tuple[str, ...]  # names in OPTIONS it runs (any other active option is refused)
  native: tuple[str, ...]  # platforms it compiles for; elsewhere it runs with interpret only
  splits_rows: bool  # runs with a row's tokens split over devices (mesh.context > 1)
  paths: dict[str, str]  # kind -> the code path it names ("compressed": the compressed kinds)
  reads_row_layout: bool = False  # reads kernels.RowLayout, computed once per step by the model


_ALL_PLATFORMS = ("cpu", "gpu", "tpu")
_KERNEL_PATHS = {"full": "kernels.chunk_attention, a whole-row window and no entries",
                 "compressed": "kernels.chunk_attention",
                 "decode": "kernels.decode_attention"}

TABLE = {
    "xla": Capability(KINDS, tuple(OPTIONS), _ALL_PLATFORMS, True, {
        "full": "jax.nn.dot_product_attention, dense document-causal mask",
        "compressed": "compressed_core.compressed_attention (query blocks at long T)",
        "decode": "kernels.decode_attention(implementation='xla')"}),
    "blockwise": Capability(("full",), (), _ALL_PLATFORMS, False,
                            {"full": "attention.blockwise (online softmax, custom VJP)"}),
    "splash": Capability(("full",), (), ("tpu",), False,
                         {"full": "attention.splash (JAX's TPU splash attention)"}),
    "pallas_gpu": Capability(("full", "fixed", "dynamic"), (), ("gpu",), False, _KERNEL_PATHS,
                             reads_row_layout=True),
    "pallas_tpu": Capability(("full", "fixed", "dynamic"), (), ("tpu",), False, _KERNEL_PATHS,
                             reads_row_layout=True),
}
assert set(IMPLEMENTATIONS) <= set(TABLE)  # the kernels' switch names are the table's

# ``auto``: per platform, the first implementation in this order that serves the layer.
AUTO = {
    "gpu": ("pallas_gpu", "xla"),
    "tpu": ("splash", "pallas_tpu", "xla"),
    "cpu": ("blockwise", "xla"),
}
PLATFORM_ALIASES = {"cuda": "gpu", "rocm": "gpu"}

CHOICES = (*TABLE, "auto")


def platform_name(platform: str) -> str:
  """JAX's backend name as a key of ``AUTO`` (an unknown backend is treated as the CPU)."""
  platform = PLATFORM_ALIASES.get(platform, platform)
  return platform if platform in AUTO else "cpu"


def refusal(attn, num_kv_heads: int, implementation: str | None = None) -> tuple[str, str] | None:
  """(field, reason) when ``implementation`` (default: the layer's) cannot serve ``attn``.

  ``attn`` is an AttentionConfig; "auto" is never refused (``xla`` serves every layer). The
  field is relative to the layer's attention section.
  """
  name = attn.implementation if implementation is None else implementation
  if name == "auto":
    return None
  cap = TABLE[name]
  if attn.kind not in cap.kinds:
    return "implementation", f"{name!r} serves kinds {list(cap.kinds)}, not {attn.kind!r}"
  for option_name, option in OPTIONS.items():
    if (attn.kind in option.kinds and option.active(attn, num_kv_heads)
        and option_name not in cap.options):
      return option.field, (f"{option.what} runs with implementation "
                            f"{' | '.join(servers(option_name))}, not {name!r}")
  return None


def servers(option_name: str) -> list[str]:
  """The implementations that serve an option."""
  return [n for n, cap in TABLE.items() if option_name in cap.options]


def choose(attn, num_kv_heads: int, platform: str) -> str:
  """The implementation ``auto`` means for this layer on ``platform`` (JAX's backend name)."""
  for name in AUTO[platform_name(platform)]:
    if refusal(attn, num_kv_heads, name) is None:
      return name
  raise AssertionError("xla serves every layer")  # checked by tests/test_dispatch.py


def context_refusal(implementation: str, context: int, what: str = "a row") -> str | None:
  """Why ``implementation`` cannot run with ``what`` (a row, a prompt) split over ``context``
  devices (None: it can)."""
  cap = TABLE.get(implementation)  # "auto" is refused too: it may choose a kernel
  if context <= 1 or (cap is not None and cap.splits_rows):
    return None
  allowed = [n for n, cap in TABLE.items() if cap.splits_rows]
  return (f"{implementation!r} cannot split {what} over mesh.context={context}; context "
          f"parallelism runs {' | '.join(repr(n) for n in allowed)}")
