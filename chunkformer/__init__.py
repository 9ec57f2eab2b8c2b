"""chunkformer: chunked KV-cache compression in transformers, its periodic blind spots, and cures."""

__version__ = "0.1.0"
