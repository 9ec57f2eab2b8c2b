"""Attention kinds, selected per layer by ``AttentionConfig.kind``.

To add a kind: write a module following the contract in ``common.py``, add its name to
``config.ATTENTION_KINDS`` and to ``KINDS`` below.
"""

from chunkformer.attention.common import AttentionContext
from chunkformer.attention.dynamic import DynamicAttention
from chunkformer.attention.fixed import FixedAttention, WindowAttention
from chunkformer.attention.full import FullAttention

KINDS = {
    "full": FullAttention,
    "window": WindowAttention,
    "fixed": FixedAttention,
    "dynamic": DynamicAttention,
}


def attention_class(kind: str):
  try:
    return KINDS[kind]
  except KeyError:
    raise NotImplementedError(
        f"attention kind {kind!r} is not implemented yet; available: {sorted(KINDS)}") from None


__all__ = ["AttentionContext", "KINDS", "attention_class"]
