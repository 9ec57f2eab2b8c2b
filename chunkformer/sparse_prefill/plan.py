"""A sparse-prefill plan: one pattern per query head of every full-attention layer.

``Plan.uniform(model, BlockSparse(top=64))`` gives every head of every full layer the same
pattern; ``search.search`` assigns each head its own from calibration prompts. Layers of other
kinds hold None and keep their own prefill: a compressed or window layer already reads a
window plus compressed entries, not T x T, and a block grid over its keys would cut across its
chunk structure. A plan is hashable (the prefill compiles once per plan) and is read by the
full-attention layer as ``ctx.sparse`` during ``decode.prefill(..., sparse=plan)``.
"""

from __future__ import annotations

import dataclasses

import jax

import kernels
from chunkformer.config import ModelConfig
from chunkformer.config_sections.errors import ConfigError, one_of, require
from chunkformer.sparse_prefill.index import Index, merge_heads
from chunkformer.sparse_prefill.patterns import Pattern

Array = jax.Array
BLOCK = 64  # MInference's block of queries and keys


@dataclasses.dataclass(frozen=True)
class Plan:
  """``layers[i]``: a tuple of one pattern per query head, or None (the layer stays dense)."""

  layers: tuple[tuple[Pattern, ...] | None, ...]
  block: int = BLOCK  # tokens per query block and key block
  implementation: str = "xla"  # kernels.block_sparse_attention: xla | pallas_gpu | pallas_tpu
  interpret: bool = False  # run the Pallas kernels on CPU

  def __post_init__(self):
    require(isinstance(self.block, int) and self.block >= 1, "sparse.block",
            f"must be an int >= 1, got {self.block!r}")
    one_of(self.implementation, kernels.IMPLEMENTATIONS, "sparse.implementation")
    for i, heads in enumerate(self.layers):
      require(heads is None or (isinstance(heads, tuple) and heads and all(
          isinstance(p, Pattern) for p in heads)), f"sparse.layers[{i}]",
          f"give a tuple of one pattern per query head, or None, got {heads!r}")

  @classmethod
  def uniform(cls, model: ModelConfig, pattern: Pattern, **settings) -> Plan:
    """Every query head of every full-attention layer reads ``pattern``; other kinds dense."""
    if not isinstance(pattern, Pattern):
      raise ConfigError(f"sparse: give a pattern of chunkformer.sparse_prefill "
                        f"(BlockSparse(top=...), ...) or a Plan, got {pattern!r}")
    return cls(tuple((pattern,) * model.num_heads if attn.kind == "full" else None
                     for attn in model.layers), **settings)

  def check(self, model: ModelConfig) -> None:
    """ConfigError if the plan does not fit the model (layers, heads, kinds)."""
    require(len(self.layers) == model.num_layers, "sparse.layers",
            f"{len(self.layers)} layers for a model of {model.num_layers}")
    for i, (heads, attn) in enumerate(zip(self.layers, model.layers, strict=True)):
      if heads is None:
        continue
      require(attn.kind == "full", f"sparse.layers[{i}]",
              f"sparse prefill applies to full-attention layers; layer {i} is {attn.kind!r} "
              f"(give None: it keeps its own prefill)")
      require(len(heads) == model.num_heads, f"sparse.layers[{i}]",
              f"{len(heads)} patterns for {model.num_heads} query heads")

  def covers(self, layer: int) -> bool:
    return self.layers[layer] is not None

  def index(self, layer: int, q_BxTxHxD: Array, k_BxTxKxD: Array) -> Index:
    """The layer's index set, each head estimated by its own pattern."""
    heads = self.layers[layer]
    distinct = list(dict.fromkeys(heads))
    indices = [p.index(q_BxTxHxD, k_BxTxKxD, self.block) for p in distinct]
    return merge_heads(indices, [distinct.index(p) for p in heads])

  def attend(self, layer: int, q_BxTxHxD: Array, k_BxTxKxD: Array,
             v_BxTxKxD: Array) -> tuple[Array, Index]:
    """(o_BxTxHxD, the index set) of the layer's prompt attention."""
    index = self.index(layer, q_BxTxHxD, k_BxTxKxD)
    o = kernels.block_sparse_attention(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, *index,
                                       block=self.block, implementation=self.implementation,
                                       interpret=self.interpret)
    return o, index


def resolve(model: ModelConfig, sparse) -> Plan | None:
  """A checked plan from ``decode.prefill``'s ``sparse=`` (None, a Pattern or a Plan)."""
  if sparse is None:
    return None
  plan = sparse if isinstance(sparse, Plan) else Plan.uniform(model, sparse)
  plan.check(model)
  return plan
