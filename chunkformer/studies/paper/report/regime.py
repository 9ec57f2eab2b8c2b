"""The report's first lines for a sweep with lookup records: what its models were trained on,
and whether its full-attention controls retrieve or answer by a shortcut.

A reviewer's first question of a lookup table is whether the controls learned the lookup: a
control at the accuracy of a strategy that never reads the target key's record
(``data/lookup_shortcuts.py``) shows no retrieval, and a row at ceiling shows no room for a
period. The numbers are the judge's (``claims/regime_numbers.py``, in the study's tables);
this module formats them.
"""

from __future__ import annotations

from chunkformer.evaluation.records.formatting import percent
from chunkformer.evaluation.report.sections import View
from chunkformer.evaluation.stats.retrieval_gate import CEILING, MARGIN
from chunkformer.studies.paper.claims import committed
from chunkformer.studies.paper.claims.regime_numbers import Regime


def _range(values) -> str:
  lo, hi = min(values), max(values)
  return f"{percent(lo)}%" if percent(lo) == percent(hi) else f"{percent(lo)}-{percent(hi)}%"


def paragraph(r: Regime | None) -> list[str]:
  """The regime paragraph (empty for a sweep without lookup records)."""
  if r is None:
    return []
  design = "; ".join(f"{n} records{' with distinct values' if d else ''}, {k} demonstrations"
                     for n, k, d in r.designs)
  out = [f"**Regime.** {r.units} units trained on task(s) {', '.join(r.tasks)}; the lookup "
         f"probe's prompts: {design}."]
  if r.full_means:
    s = r.shortcut
    shortcut = (f"the best strategy that never reads the target's record, "
                f"{s['best'].replace('_', ' ')}, scores {percent(s['mean'])}%; a random "
                f"undemonstrated record's value {percent(s['means']['undemonstrated'])}%")
    if r.full_below:
      out.append(f"**The full-attention controls did not learn the lookup**: prefix mean "
                 f"{_range(r.full_means)} over {len(r.full_means)} units, {r.full_below} of "
                 f"them less than {percent(MARGIN)} points above the shortcut ({shortcut}); "
                 "under claim rules 5 they decide no claim that needs a learned control (C11, "
                 "C13, a cure's reference).")
    else:
      out.append(f"The full-attention controls retrieve: prefix mean {_range(r.full_means)} "
                 f"over {len(r.full_means)} units, every one more than {percent(MARGIN)} "
                 f"points above the shortcut ({shortcut}).")
  elif not r.any_shortcut:
    out.append("The records store no shortcut baseline (`scripts/lookup_shortcuts.py` adds "
               "it), so whether the controls retrieve is not stated here.")
  if r.ceiling:
    out.append(f"Rows with a unit at or above {percent(CEILING)}% of prefix prompts (no room "
               f"for a period): {', '.join(r.ceiling)}.")
  return [" ".join(out), ""]


def lines(view: View) -> list[str]:
  """The report hook: the paragraph of the study's tables."""
  return paragraph(getattr(view.tables, "regime", None))


def of_committed(opened: committed.Opened) -> str:
  """A committed sweep's regime paragraph, as its report opens (the paper's-table notebook)."""
  return " ".join(paragraph(opened.tables.regime)).strip()
