"""Checkpoint converters between chunkformer run directories and other formats."""
