"""The judging step of a sweep: records and stored matrices in; claims, verdict lines, the
seed-pooled records and the statistics of the report's tables out (``Judged``).

Everything here is recomputable from a sweep directory alone: the records (results.json), the
correctness matrices (``DIR/correct/``) and a language model's per-token loss rows
(``DIR/lm_loss/``), with the sweep's seed and resample counts. The sweep calls ``judge`` once
and hands the result to ``report``, which formats it and computes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from chunkformer.evaluation.claims import (
    loss_signatures,
    plan_check,
    pooling,
    registry,
    summaries,
)
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.loss_rows import RowsLoader
from chunkformer.evaluation.records.variant import VariantRecord


@dataclasses.dataclass(frozen=True)
class Tables:
  """The statistics the report's tables show (``summaries``, ``loss_signatures``)."""

  seeds: tuple[summaries.SeedRow, ...] = ()
  split_labels: tuple[summaries.SplitLabelBlock, ...] = ()
  chunk_phases: tuple[summaries.ChunkPhaseRow, ...] = ()
  shift_grid: summaries.ShiftGrid | None = None
  code_accuracy: Mapping[str, float | None] = dataclasses.field(default_factory=dict)
  # variant -> pooled loss signature; None without stored loss rows
  loss_signatures: Mapping[str, dict[str, Any]] | None = None


@dataclasses.dataclass(frozen=True)
class Judged:
  claims: tuple[Claim, ...]
  verdicts: tuple[str, ...]  # the verdict lines, per trained model then per seed-pooled record
  pooled: Mapping[str, VariantRecord]  # variant -> its seed-pooled record (``pooling``)
  tables: Tables


def judge(records: Sequence[VariantRecord], matrices: correctness.Loader | None, *,
          loss_rows: RowsLoader | None = None, seed: int = 0, num_resamples: int = 2000,
          num_permutations: int = 2000, plan: Mapping[str, Any] | None = None) -> Judged:
  """Judges a sweep's records (module docstring); ``matrices`` reads a unit's correctness
  matrices (``correctness.loader``), ``loss_rows`` its loss rows (``loss_rows.loader``);
  ``plan``: the sweep's plan file as it is now (``provenance.file_state``), against which
  every unit's verdict lines are flagged (``plan_check``)."""
  resampling = dict(seed=seed, num_resamples=num_resamples, num_permutations=num_permutations)
  pooled = pooling.pooled_records(records, matrices, **resampling)
  flags = plan_check.flags(records, plan)
  found = registry.evidence(records, matrices, pooled=pooled, plan_flags=flags, **resampling)
  # judged once: the lines of C1-C9, then those C10-C16 carry
  lines = plan_check.flag_lines(found.judgments, found.pooled_judgments, records, flags)
  claims = plan_check.flag_claims(registry.decide_on(found), found.judgments, records, flags)
  lines += [line for c in claims for line in c.numbers.get("lines", ())]
  code = loss_signatures.code_accuracies(records)
  signatures = None
  if loss_rows is not None and code:
    signatures = loss_signatures.pooled_signatures(records, loss_rows, **resampling)
  tables = Tables(summaries.seed_rows(records, pooled), summaries.split_label_blocks(records),
                  summaries.chunk_phase_rows(records, matrices),
                  summaries.shift_grid(records, matrices), code, signatures)
  return Judged(tuple(claims), tuple(lines), pooled, tables)
