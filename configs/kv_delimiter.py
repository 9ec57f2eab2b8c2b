"""Rule-based dynamic chunks on key-value retrieval: a chunk closes after delimiter tokens.

  python train.py --config configs/kv_delimiter.py --workdir workdirs/kv_delimiter

Everything as configs/kv_chunk.py (fixed M = 4, window 8, ...), except where chunks end. The
kv rows (chunkformer/data/kv.py) are BOS, a haystack of filler tokens (ids 3..6, uniformly
random) holding key-value needles made of symbol tokens, then query blocks QUERY (id 2), key,
value. Filler plays the role of whitespace in text and QUERY of a line break, so the
delimiters are QUERY and two of the four filler ids (2, 3, 4): about half of the filler tokens
and every query marker may end a chunk. Symbols are never delimiters, so a needle's key and
value always share a chunk unless max_chunk cuts it, and where chunks end depends on the
content: once a shifted and an unshifted row close a chunk at the same content token they agree
from there on (measured with k = 1..8 inserted filler tokens: 97-99% of the content's
boundaries unchanged, 100% after the first shared one; with min_chunk 1 the rule is exact after
the content's first delimiter, tests/test_chunking.py).
Chunks hold 3 to 8 tokens (min_chunk 3 turns "half the filler" into ~1 entry per 4 tokens);
measured on 8 held-out batches of this config's kv rows: 4.02 tokens per entry, the M = 4
budget. Entry capacity ceil(256 / 3) -> 88 per row.

Variant: delimiters "2,3" with chunks of 2 to 6 tokens gives 4.00 tokens per entry.
"""

from configs import kv_chunk


def get_config():
  c = kv_chunk.get_config()
  c.model.attention.kind = "dynamic"
  c.model.attention.boundary = "delimiter"
  c.model.attention.delimiters = "2,3,4"  # QUERY and two filler ids (chunkformer/data/kv.py)
  c.model.attention.chunk_size = 4  # nominal budget (the rule itself sets the chunk length)
  c.model.attention.min_chunk = 3  # tokens; a delimiter closes only chunks this long
  c.model.attention.max_chunk = 8  # tokens; a chunk is forced closed at this length
  return c
