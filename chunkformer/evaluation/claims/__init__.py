"""Judging a sweep's records: which claims the trained models support.

``judge`` (judging.py) is the judging step: records and stored matrices in; the claims of
``CLAIMS`` (registry.py, filled by the studies, ``chunkformer.studies``), the verdict lines,
the seed-pooled records (seed_pooling.py) and the statistics of the report's tables out.
standards.py holds the gates and the "no period" rule every study shares (the seed rule and
the common verdict over parts are ``stats.seed_rule``'s), plan_check.py flags units trained
under another plan. The verdict words are ``stats.seed_rule``'s, re-exported here.
"""

from chunkformer.evaluation.claims.judging import Judged, judge
from chunkformer.evaluation.claims.registry import CLAIMS, Evidence
from chunkformer.evaluation.stats.seed_rule import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    VERDICTS,
)

__all__ = ["CLAIMS", "INCONCLUSIVE", "NOT_REPRODUCED", "REPRODUCED", "VERDICTS", "Evidence",
           "Judged", "judge"]
