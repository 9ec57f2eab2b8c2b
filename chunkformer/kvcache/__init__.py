"""Decoding caches, one module per attention kind, and the pieces they share.

- ``common.py``: index, hidden-state history (token shift), the ring buffer of raw keys/values;
- ``full.py``: every raw key/value (the ``full`` kind);
- ``fixed.py``: ring + fixed-chunk entries + the open chunk's slots (``window``/``fixed``; also
  the lightning indexer's own entries), and its decoding step;
- ``dynamic.py``: ring + content-defined entries (``dynamic``), and its decoding step.
Every kind's ``init_cache(model, attn, layer, batch, max_len)`` returns the layer's arrays, and
``Kind.__call__`` with ``ctx.decode`` reads and updates them in the Flax ``cache`` collection
(variable ``state``); the attention steps call ``kernels.decode_attention``. Nothing here
imports chunkformer/attention (the kinds hand their submodules in as ``Parts``). The public API
is chunkformer/decode.py.
"""
