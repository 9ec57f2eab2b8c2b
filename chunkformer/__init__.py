"""chunkformer: chunked KV-cache compression, its periodic blind spots, and their cures."""

from chunkformer import package_check

__version__ = "0.1.0"

package_check.check()  # kernels/ and configs/ must be ours before anything imports them
