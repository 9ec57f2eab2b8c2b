"""The report's first lines for a sweep with lookup records: what its models were trained on,
and whether its full-attention controls retrieve or answer by a shortcut.

A reviewer's first question of a lookup table is whether the controls learned the lookup: a
control at the accuracy of a strategy that never reads the target key's record
(``data/lookup_shortcuts.py``) shows no retrieval, and a row at ceiling shows no room for a
period. Every number here is read from the records (the lookup probe's accuracy and its
stored shortcuts), so the lines stay true of the committed data.
"""

from __future__ import annotations

from chunkformer.evaluation.records.formatting import percent
from chunkformer.evaluation.report.sections import View
from chunkformer.evaluation.stats import retrieval_gate
from chunkformer.studies.paper.claims import committed
from chunkformer.studies.paper.claims import paper_rows as pr

PADDING = "prefix"


def _range(values) -> str:
  lo, hi = min(values), max(values)
  return f"{percent(lo)}%" if percent(lo) == percent(hi) else f"{percent(lo)}-{percent(hi)}%"


def lines(view: View) -> list[str]:
  """The regime paragraph (empty for a sweep without lookup records)."""
  units = [r for r in view.records if pr.lookup_modes(r) and PADDING in pr.lookup_modes(r)]
  if not units:
    return []
  settings = {(r.setup.task, r.probes[pr.LOOKUP]["settings"].get("num_records"),
               r.probes[pr.LOOKUP]["settings"].get("num_demos"),
               bool(r.probes[pr.LOOKUP]["settings"].get("distinct_values"))) for r in units}
  tasks = sorted({t for t, *_ in settings})
  design = "; ".join(f"{n} records{' with distinct values' if d else ''}, {k} demonstrations"
                     for _, n, k, d in sorted(settings, key=str))
  out = [f"**Regime.** {len(units)} units trained on task(s) {', '.join(tasks)}; the lookup "
         f"probe's prompts: {design}."]
  shortcuts = [(r, pr.shortcut(r, PADDING)) for r in units]
  known = [(r, s) for r, s in shortcuts if s is not None]
  full = [(r, s) for r, s in known if pr.is_full(r.setup)]
  if full:
    means = [pr.lookup_modes(r)[PADDING].mean for r, _ in full]
    stored = full[0][0].probes[pr.LOOKUP]["shortcuts"]
    record = next(stored[k] for k in pr.MATRIX_KEYS[PADDING] if k in stored)
    below = [r for (r, s), m in zip(full, means, strict=True)
             if m < s + retrieval_gate.MARGIN]
    shortcut = (f"the best strategy that never reads the target's record, "
                f"{record['best'].replace('_', ' ')}, scores {percent(record['mean'])}%; a "
                f"random undemonstrated record's value "
                f"{percent(record['means']['undemonstrated'])}%")
    if below:
      out.append(f"**The full-attention controls did not learn the lookup**: prefix mean "
                 f"{_range(means)} over {len(full)} units, {len(below)} of them less than "
                 f"{percent(retrieval_gate.MARGIN)} points above the shortcut ({shortcut}); "
                 "under claim rules 5 they decide no claim that needs a learned control (C11, "
                 "C13, a cure's reference).")
    else:
      out.append(f"The full-attention controls retrieve: prefix mean {_range(means)} over "
                 f"{len(full)} units, every one more than {percent(retrieval_gate.MARGIN)} "
                 f"points above the shortcut ({shortcut}).")
  elif not known:
    out.append("The records store no shortcut baseline (`scripts/lookup_shortcuts.py` adds "
               "it), so whether the controls retrieve is not stated here.")
  ceiling = sorted({r.setup.variant for r in units
                    if pr.lookup_modes(r)[PADDING].mean >= retrieval_gate.CEILING})
  if ceiling:
    out.append(f"Rows with a unit at or above {percent(retrieval_gate.CEILING)}% of prefix "
               f"prompts (no room for a period): {', '.join(ceiling)}.")
  return [" ".join(out), ""]


def of_committed(opened: committed.Opened) -> str:
  """A committed sweep's regime paragraph, as its report opens (the paper's-table notebook)."""
  view = View(opened.results.variants, opened.claims, opened.tables, "", opened.directory)
  return " ".join(lines(view)).strip()
