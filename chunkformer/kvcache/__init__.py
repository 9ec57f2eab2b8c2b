"""Decoding caches: shared pieces (index, hidden-state history, ring buffer) and the full cache.

Every attention kind owns its cache: ``Kind.init_cache(model, attn, layer, batch, max_len)``
returns the layer's arrays, and ``Kind.__call__`` with ``ctx.decode`` reads and updates them in
the Flax ``cache`` collection (variable ``state``). The public API is chunkformer/decode.py.
"""
