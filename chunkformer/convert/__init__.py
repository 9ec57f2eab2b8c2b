"""Weight conversion from published checkpoints into chunkformer parameters."""
