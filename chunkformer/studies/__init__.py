"""The studies built on the evaluation engine, one package each, and the one place they are
assembled: ``STUDIES`` in the order their probes run, their claims are listed and their report
sections follow each other.

Adding a study: a package ``chunkformer/studies/<name>/`` exporting ``STUDY``
(``evaluation.sweep.catalog.Study``: its probes, claims, judging and report hooks), and one
entry below (docs/extending.md, "How to add a study"). A study imports the engine
(``chunkformer.evaluation``) and the core library, never another study.
"""

from chunkformer.evaluation.sweep import catalog
from chunkformer.studies import eviction, lm, needles, paper, sparse_prefill

STUDIES = (needles.STUDY, paper.STUDY, eviction.STUDY, sparse_prefill.STUDY, lm.STUDY)


def install() -> None:
  """Puts every study's probes, claims and report hooks into the engine's registries (entry
  points call it before a sweep; calling it again changes nothing)."""
  catalog.install(STUDIES)
