"""The evaluation engine: sweeps, probes, claims, judging and reports, knowing no study.

  stats/    numpy/scipy statistics on arrays (intervals, phase accuracy, period tests, the
            typed ``Analysis``, the seed rule and its verdict words); no JAX, no files
  records/  the typed records a sweep stores (variant records, claims, results.json, the
            correctness matrices and loss rows on disk, the one number format) and their
            readers, which refuse a truncated or foreign file in one line
  probes/   the probe protocol and ``PROBES``; the instruments several studies share (needle
            sweep, prefix probe, slot gains, the position-matched lookup tests, eviction)
  claims/   the claim protocol and ``CLAIMS``, the shared standards, seed pooling, plan flags and
            ``judge`` (claims, verdict lines and every statistic the report shows)
  report/   rendering only: markdown and figures of what ``judge`` and the records hold, and
            the studies' report hooks
  sweep/    the sweep config, train / evaluate / resume / merge / rejudge, shards, the files,
            and the ``Study`` type the studies export (``sweep.catalog``)

The studies (``chunkformer.studies``: needles C1-C9, paper C10-C16, eviction E1-E3, lm) fill
the registries when installed. ``tests/test_imports.py`` enforces the order stats <- records <-
probes, claims <- report <- sweep (probes and claims never import each other), here and inside
every study, and that the engine imports no study.
"""
