"""Splitting a sweep's variants over processes or machines: ``--shard i/n`` and the merge.

Shard i of n (0 <= i < n) owns the variants at positions i, i + n, i + 2n, ... of the sweep's
variant order (``sweep.order``): deterministic, independent of which variants are already
trained, and balanced to one variant. Each shard trains and evaluates only its variants and
writes one record file per variant (``DIR/<variant>/sweep_record.json``, the results.json
entry) and its correctness matrices; the merge (``eval.py --merge``, or the shard that finds
every record present) reads the records and writes the one results.json, report and plots.
Shards that run on different machines share nothing but ``DIR``: copy their variant
directories, ``DIR/plots`` and ``DIR/correct`` into one ``DIR`` before merging.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import TypeVar

from chunkformer.config import ConfigError

FLAG = "--shard"
_SPEC = re.compile(r"(\d+)/(\d+)")
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Shard:
  index: int
  count: int

  def __str__(self) -> str:
    return f"{self.index}/{self.count}"

  def select(self, items: Sequence[T]) -> list[T]:
    """The items this shard owns (positions index, index + count, ...)."""
    return list(items[self.index::self.count])


def parse(text: str) -> Shard:
  """'i/n' -> Shard(i, n); anything else is a ConfigError naming the flag."""
  match = _SPEC.fullmatch(text.strip()) if isinstance(text, str) else None
  if match is None:
    raise ConfigError(f"{FLAG} {text!r}: expected i/n (shard i of n, 0 <= i < n), e.g. "
                      f"{FLAG} 0/2 and {FLAG} 1/2")
  index, count = int(match.group(1)), int(match.group(2))
  if count < 1 or index >= count:
    raise ConfigError(f"{FLAG} {text!r}: need n >= 1 and 0 <= i < n (shards are numbered "
                      f"from 0), e.g. {FLAG} 0/{max(count, 2)}")
  return Shard(index, count)


def check_count(shard: Shard, num_variants: int) -> None:
  """More shards than variants would leave some empty: refused before anything runs."""
  if shard.count > num_variants:
    raise ConfigError(f"{FLAG} {shard}: the sweep has {num_variants} variant(s), so at most "
                      f"{num_variants} shards; use {FLAG} i/{num_variants} or fewer")
