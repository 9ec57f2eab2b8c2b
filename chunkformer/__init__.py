"""chunkformer: chunked KV-cache compression, its periodic blind spots, and their cures."""

__version__ = "0.1.0"
