"""Inference-time KV eviction on full-attention kv models: does eviction create weak spots?

  python eval.py --config configs/sweeps/eviction.py --workdir results/eviction
  (the tiny end-to-end check of the pipeline: configs/sweeps/eviction.py:tiny, seconds)

Three seeds of one full-attention model trained here on the kv task with 2-token keys and
values, each evaluated under every policy of ``POLICIES`` at three budgets (``BUDGETS``) by the
``eviction_needles`` probe: the cache is pruned once the prompt is read (it ends right before
the moved needle's first answer token, so the observation window holds the query's QUERY
marker and first key token), the answer is decoded from the pruned cache, and the needle moves
over 40 consecutive offsets at the far depth (lcm(4, 8, 10) = 40: every phase of ChunkKV's
chunk lengths L = 4, 8, 10 occurs equally often) in 32 haystacks. Accuracy by needle offset
mod L for each L; the matrices stay in ``DIR/correct/`` for claims E1-E3 (docs/claims.md).

The model: the study's (2 layers, width 64, 4 heads, T = 160, 6 pairs, 4 queries; its
``SHARED``) with keys and queries shifted by 3 (``model.query_shift``), the study's setting in
which full attention learned 2-token needles in every seed (held-out far accuracy 0.986-0.998
at 3000 steps, results/study/HISTORY.md, ninth part). The budget, fixed before any unit of this
sweep trained, by the study's rule (twice the first evaluated step at which a calibration run
reached >= 0.95): the calibration (2026-12-03 16:00-16:11 UTC, one single-threaded process
at nice 19 on a loaded machine: ``train.py --config configs/kv_full.py`` with this file's
SHARED but ``train.steps=1500 train.eval_every=250``, seed 0) reached held-out far accuracy
0.974 at step 250, the first evaluated step (training far accuracy 0.981 at step 400, where it
was stopped), so STEPS = 600 (at least twice that, the demo's budget). A seed below 0.9
held-out far accuracy before eviction is undecided in every eviction claim.

Policies (every budget in tokens, of a prompt of 143 tokens): StreamingLLM (4 sinks), SnapKV
(observation window 8, max pooling over 7; kvpress's SnapKVPress uses window 64, kernel 5,
average pooling), H2O (8 recent tokens), KNorm, ChunkKV with chunks of L = 4, 8 and 10
(ChunkKV's paper uses 10) on the grid from position 0 in two forms: as published
(``chunkkv``: whole chunks over the whole prompt, the budget rounded down to them: 15/15/13,
31/31/23 and 63/63/63 tokens at L = 4/8/10) and cutting one chunk to fill the budget exactly
(``chunkkv_cut``, a grid over the prefix before the window), and content-chunked ChunkKV with
the kv task's delimiter rule (configs/kv_delimiter.py: QUERY and two of the four filler ids
close a chunk, chunks of 3 to 8 tokens, about 4 tokens each, so a needle's symbols share a
chunk unless max_chunk cuts it; it fills its budget as ``chunkkv_cut`` does), all with
SnapKV's scorer and window 8. Budgets: 16, 32 and 64 tokens (11%, 22% and 45% of the prompt;
8, 24 and 56 beyond the window). The first run (2026-12-03) had the cut form only, then named
``chunkkv``; the published form was added and evaluated on 2026-12-05 (results/eviction/RUN.md).

Cost (estimated 2026-12-03 before the first run, which took 38 min as one process on shared
cores: results/eviction/RUN.md): training 600 steps at 2.1-3.6 steps/s on one
core (the study's rates for this model), 3-5 min per unit; the eviction probe, measured on the
calibration checkpoint with this config's options, about 6 s of one core per policy to run
(1280 rows) and 6 s to compile it the first time, so 2.5-5 min per unit; judging E1-E3 well
under a minute. In all about 16-29 min of one core, 10-17 min with two shards
(``--shard 0/2``, ``--shard 1/2``) and 15-25 min as one two-thread process. The code LMs
are not in this sweep: the eviction probe asks kv needles only.
"""

from configs.sweeps import policy_sweeps

# The model block, shared with the sparse-prefill sweep (configs/sweeps/policy_sweeps.py).
STEPS = policy_sweeps.STEPS  # the budget rule of the module docstring
SHARED = policy_sweeps.SHARED
SEEDS = policy_sweeps.SEEDS

WINDOW = 8  # SnapKV's observation window (and ChunkKV's), H2O's recent tokens
BUDGETS = (16, 32, 64)  # tokens
CHUNKS = (4, 8, 10)  # ChunkKV's chunk lengths L
# The kv task's delimiter rule (configs/kv_delimiter.py): QUERY (2) and filler ids 3 and 4.
DELIMITERS = dict(delimiters=[2, 3, 4], min_chunk=3, max_chunk=8)
NEEDLES = dict(num_offsets=40, num_haystacks=32, depths=(0.0,))


def policies(budgets=BUDGETS, chunks=CHUNKS, window=WINDOW, delimiters=None) -> list[dict]:
  """Every policy at every budget, budget-major (the probe's order, the report's rows)."""
  delimiters = DELIMITERS if delimiters is None else delimiters
  out = []
  for b in budgets:
    out += [dict(policy="streaming_llm", budget=b, sinks=4),
            dict(policy="snapkv", budget=b, window=window),
            dict(policy="h2o", budget=b, recent=window),
            dict(policy="knorm", budget=b)]
    out += [dict(policy="chunkkv", budget=b, chunk=m, window=window) for m in chunks]
    out += [dict(policy="chunkkv_cut", budget=b, chunk=m, window=window) for m in chunks]
    out.append(dict(policy="content_chunkkv", budget=b, window=window, **delimiters))
  return out


# The tiny pipeline check's policies (tests/test_eviction_sweep.py, ``policy_sweeps.tiny``):
# one budget, one policy of each kind the claims read; nothing it finds is a result.
TINY_POLICIES = [
    dict(policy="streaming_llm", budget=8, sinks=2),
    dict(policy="snapkv", budget=8, window=2),
    dict(policy="chunkkv", budget=8, chunk=4, window=2),
    dict(policy="chunkkv_cut", budget=8, chunk=4, window=2),
    dict(policy="content_chunkkv", budget=8, window=2, delimiters=[3], min_chunk=2, max_chunk=4),
]


def get_config(arg: str = ""):
  return policy_sweeps.get_config(
      "configs/sweeps/eviction.py", arg, "eviction", "eviction_needles", NEEDLES,
      dict(policies=TINY_POLICIES), policies=policies(), prompt_end="question",
      phase_sizes=CHUNKS)
