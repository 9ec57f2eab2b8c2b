"""Shift-invariance probe of chunk boundaries: insert filler, see which boundaries move.

Content-defined boundaries follow the content when filler is inserted in front of it; fixed
boundaries stay on the grid, so their relation to the content changes with k mod M. The probe
inserts k filler tokens at index ``at`` (after BOS for the kv task), drops the last k tokens to
keep the row length, and compares the chunk ends inside the content (original index
``at <= t < T - k - 1`` against shifted index ``t + k``; the last content token is left out
because under the router's 'start' rule its end flag depends on the token after it, which the
shifted row has dropped).
"""

from __future__ import annotations

import numpy as np

import kernels


def insert_filler(tokens_BxT: np.ndarray, k: int, filler_ids: tuple[int, ...], at: int = 1,
                  seed: int = 0) -> np.ndarray:
  """Rows with k random filler tokens inserted at index ``at``; same length (the tail drops)."""
  tokens = np.asarray(tokens_BxT)
  rng = np.random.default_rng(seed)
  filler = rng.choice(np.asarray(filler_ids), size=(tokens.shape[0], k))
  return np.concatenate([tokens[:, :at], filler, tokens[:, at:tokens.shape[1] - k]], axis=1)


def boundary_agreement(ends_BxC: np.ndarray, shifted_ends_BxC: np.ndarray, k: int, seq_len: int,
                       at: int = 1) -> dict[str, float]:
  """How many of the content's chunk ends survive the insertion of k filler tokens.

  ``ends``/``shifted_ends`` are packed entry ends (row indices, ``kernels.PAD_END`` padding) of
  the original and the shifted rows. Returns counts and ``unchanged`` = |both| / |either|
  (a boundary counts as unchanged when it sits on the same content token in both rows) and
  ``unchanged_after_resync``, the same over the content after the first boundary both place.
  """
  both = either = both_after = either_after = 0
  for row, shifted in zip(np.asarray(ends_BxC), np.asarray(shifted_ends_BxC), strict=True):
    a = {int(e) for e in row if e != kernels.PAD_END and at <= e < seq_len - k - 1}
    b = {int(e) - k for e in shifted if e != kernels.PAD_END and at <= e - k < seq_len - k - 1}
    both += len(a & b)
    either += len(a | b)
    if a & b:
      first = min(a & b)
      both_after += len({e for e in a & b if e > first})
      either_after += len({e for e in a | b if e > first})
  return {"boundaries_both": both, "boundaries_either": either,
          "unchanged": both / max(either, 1),
          "unchanged_after_resync": both_after / max(either_after, 1)}
