"""Language models' loss by position mod M: does a compressed LM's held-out loss carry the
chunk period (the loss signature), against full attention's?

Probe: ``lm_phase_loss`` (per-token loss rows to ``DIR/lm_loss/``); judging: the pooled loss
signatures and code accuracies (``claims.loss_signatures``); report: the unit and variant
tables and the excess-loss figure (``report.loss_tables``).
"""

from chunkformer.evaluation.claims.registry import Judging
from chunkformer.evaluation.report.sections import ReportHooks
from chunkformer.evaluation.sweep.catalog import Study
from chunkformer.studies.lm.claims import loss_signatures
from chunkformer.studies.lm.probes import lm_phase_loss
from chunkformer.studies.lm.report import loss_tables

STUDY = Study(
    name="lm",
    probes={"lm_phase_loss": lm_phase_loss.probe},  # language models: loss by position mod M
    judging=Judging(tables=loss_signatures.tables),
    report=ReportHooks(sections=loss_tables.sections),
)
