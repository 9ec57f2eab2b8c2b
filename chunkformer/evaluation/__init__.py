"""Evaluation of periodicity sweeps, in layers that import only downwards.

  stats/    numpy/scipy statistics on arrays (intervals, phase accuracy, period tests, the
            typed ``Analysis``, the seed rule and its verdict words); no JAX, no files
  records/  the typed records a sweep stores (variant records, claims, results.json, the
            correctness matrices and loss rows on disk, the one number format)
  probes/   a trained or loaded model in, correctness matrices and typed record fields out;
            ``PROBES`` names every probe a sweep config can enable
  claims/   judging: per-model judgments, the seed rule over seeds, seed-pooled records,
            ``CLAIMS`` (C1-C9, one function each) and ``judge`` (claims, verdict lines and the
            statistics the report's tables show)
  report/   rendering only: markdown and figures of what ``claims.judge`` and the records hold
  sweep/    the sweep config, train / evaluate / resume / merge / rejudge, shards, the files

``tests/test_imports.py`` enforces the order stats <- records <- probes, claims <- report <-
sweep (probes and claims never import each other).
"""
