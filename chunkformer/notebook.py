"""What the notebooks in notebooks/ share: run size, where runs live, small display helpers.

``CHUNKFORMER_FAST=1`` (set by CI) makes every notebook run its cells at toy sizes in a fresh
temporary directory; without it they train the demo's models under ``runs/`` (the checkout's,
or the working directory's when chunkformer is pip-installed, as in Colab), where a rerun of
the notebook or ``./run.sh demo`` finds them finished and does not retrain.
"""

from __future__ import annotations

import atexit
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from absl import logging

from chunkformer import trainer
from chunkformer.config import DataConfig
from chunkformer.data import code, kv
from chunkformer.evaluation.records import formatting
from chunkformer.evaluation.records.variant import VariantRecord

FAST_ENV = "CHUNKFORMER_FAST"
RUNS_ENV = "CHUNKFORMER_RUNS"
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fast_mode() -> bool:
  """Whether ``CHUNKFORMER_FAST`` asks for the toy-sized run (any value but '', '0')."""
  return os.environ.get(FAST_ENV, "") not in ("", "0")


def setup() -> bool:
  """A notebook's first step; returns ``fast_mode()``.

  Leaves only errors in the absl log (the notebooks print their own progress). In fast mode
  XLA also skips most optimisations: the toy programs run in microseconds and compiling them
  is what costs (about half of a fast notebook's CPU time otherwise).
  """
  quiet_logs()
  fast = fast_mode()
  if fast:
    jax.config.update("jax_disable_most_optimizations", True)
  return fast


def runs_dir() -> str:
  """``$CHUNKFORMER_RUNS`` if set; else ``<checkout>/runs`` when chunkformer is imported from a
  source checkout, else ``./runs``."""
  if os.environ.get(RUNS_ENV):
    return os.path.abspath(os.environ[RUNS_ENV])
  if os.path.isfile(os.path.join(_ROOT, "setup.cfg")):
    return os.path.join(_ROOT, "runs")
  return os.path.abspath("runs")


def workdir(name: str) -> str:
  """``runs_dir()/name``, or in fast mode a fresh temporary directory (nothing is reused),
  removed when the process (the notebook's kernel) exits."""
  if fast_mode():
    path = tempfile.mkdtemp(prefix=f"chunkformer_{name}_")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path
  return os.path.join(runs_dir(), name)


def quiet_logs() -> None:
  """Only errors from absl (training narrates every step; the notebooks print their own)."""
  logging.set_verbosity(logging.ERROR)


def progress_printer(name: str) -> Callable[[trainer.Progress], None]:
  """A ``trainer.train`` progress hook printing one short line per log interval."""
  def hook(progress: trainer.Progress) -> None:
    if progress.split != "train":
      return
    eta = progress.eta_s
    print(f"  {name}: step {progress.step}/{progress.total_steps}  "
          f"loss {progress.metrics['loss']:.3f}  answer acc {progress.metrics['accuracy']:.3f}  "
          f"{progress.steps_per_sec:.1f} steps/s"
          + (f"  ETA {eta:.0f} s" if math.isfinite(eta) and eta > 0 else ""), flush=True)
  return hook


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], digits: int = 3) -> str:
  """A markdown table; floats printed with ``digits`` decimals, None as '-'."""
  def cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
      return "-"
    if isinstance(value, (float, np.floating)):
      return f"{value:.{digits}f}"
    return str(value)

  lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
  lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
  return "\n".join(lines)


def phase_table(records: Sequence[VariantRecord]) -> str:
  """Accuracy per phase (offset mod M) of sweep records, with 95% bootstrap intervals, plus
  the max gap, detected period and permutation p-value: one row per variant."""
  phases = sorted({p for r in records for p in r.analysis.phase.phases})
  rows = []
  for r in records:
    table = r.analysis.phase
    by_phase = {p: (a, lo, hi) for p, a, lo, hi in zip(
        table.phases, table.accuracy.values, table.accuracy.low, table.accuracy.high,
        strict=True)}
    cells = []
    for p in phases:
      a, lo, hi = by_phase.get(p, (None, None, None))
      cells.append("-" if a is None else f"{a:.2f} [{lo:.2f}, {hi:.2f}]")
    p = r.analysis.p_value
    rows.append([r.name, *cells, table.gap.value, r.analysis.detected_period or "none",
                 formatting.p_value(p)])
  headers = ["variant", *(f"phase {p}" for p in phases), "max gap", "period", "p"]
  return markdown_table(headers, rows)


def token_labels(tokens_T: Sequence[int], data: DataConfig) -> list[str]:
  """One printable character per token: bytes as themselves for code, and for kv rows
  '^' BOS, '?' QUERY, '.' filler, letters for symbols ('_' padding)."""
  labels = []
  for token in (int(t) for t in tokens_T):
    if data.task == "code":
      special = {code.BOS: "^", code.PAD: "_", code.QUERY: "?", code.FILE_SEP: "|"}
      char = special.get(token) or chr(token)
      labels.append({"\n": "↵", "\t": "⇥", " ": "·"}.get(char, char if char.isprintable()
                                                           else "¿"))
    elif token == kv.BOS:
      labels.append("^")
    elif token == kv.QUERY:
      labels.append("?")
    elif token == kv.PAD:
      labels.append("_")
    elif token < kv.symbol_base(data):
      labels.append(".")
    else:
      symbol = token - kv.symbol_base(data)
      labels.append(chr(ord("a") + symbol) if symbol < 26 else chr(ord("A") + symbol - 26))
  return labels


def stdlib_snippet(path: str = "calendar.py", start: str = "\ndef ", max_bytes: int = 200) -> bytes:
  """The first function of a standard-library file (the code task's corpus), up to its first
  blank line and at most ``max_bytes`` bytes: real code on every machine, nothing downloaded."""
  with open(os.path.join(code.stdlib_root(), path), "rb") as f:
    text = f.read()
  first = text.find(start.encode())
  first = 0 if first < 0 else first + start.startswith("\n")
  stop = text.find(b"\n\n", first)
  return text[first:stop + 1 if stop >= 0 else len(text)][:max_bytes]
