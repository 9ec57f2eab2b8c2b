"""Judging a sweep's records: which claims the trained models support.

``judge`` (judging.py) is the judging step: records and stored matrices in; the claims of
``CLAIMS`` (registry.py, one function per claim, numbered C1-C9), the verdict lines
(judgments.py: each claim per trained model), the seed-pooled records (pooling.py) and the
statistics of the report's tables (summaries.py, loss_signatures.py) out. combine.py applies
the one seed rule (``stats.seed_rule``) over a variant's seeds; multiplicity.py adjusts each
claim's tests for their number (Holm) and adds the haystack-level test; step_size.py (C5) and
slot_preference.py (C6) hold the claims tested on the stored data. The verdict words are
``stats.seed_rule``'s, re-exported here.
"""

from chunkformer.evaluation.claims.judging import Judged, Tables, judge
from chunkformer.evaluation.claims.registry import CLAIMS, Evidence
from chunkformer.evaluation.stats.seed_rule import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    VERDICTS,
)

__all__ = ["CLAIMS", "INCONCLUSIVE", "NOT_REPRODUCED", "REPRODUCED", "VERDICTS", "Evidence",
           "Judged", "Tables", "judge"]
