"""Sparse prefill on full-attention kv models: does a block-sparse prefill create weak spots?

  python eval.py --config configs/sweeps/sparse_prefill.py --workdir results/sparse_prefill
  (the tiny end-to-end check of the pipeline: configs/sweeps/sparse_prefill.py:tiny, seconds)

The eviction sweep's models (configs/sweeps/eviction.py: three seeds of full attention on
2-token needles with keys and queries shifted by 3, 600 steps; the block both sweeps share,
``policy_sweeps.models`` with ``SHARED``), the models of
this project that retrieve on CPU (held-out far accuracy 0.97-0.98 there). Each is evaluated
by the ``sparse_needles`` probe under every pattern of ``patterns()``: the prompt (144 tokens,
the whole query included, ``prompt_end="answer"``) goes through
``decode.prefill(..., sparse=Plan.uniform(model, pattern, block=B))``, so the first answer
token comes from the sparse prefill's last position and the rest is decoded densely from the
cache it wrote (whose later layers' keys and values read the sparse attention of earlier
layers). The first run ended the prompt one token earlier (``prompt_end="question"``, the
eviction probe's setting), which decoded the query's last token densely: results/sparse_prefill
/RUN.md.
The needle moves over 48 consecutive offsets at the far depth (three periods of lcm(8, 16) =
16: every residue of both block sizes occurs equally often) in 32 haystacks; accuracy by
needle offset mod B for B = 8 and 16; the matrices stay in ``DIR/correct/`` for claims P1-P2
(docs/claims.md).

Not the paper-protocol rows nor an imported Qwen3: the protocol's full-attention rows do not
learn the lookup on CPU (12.9-14.1%, results/paper_protocol/RUN.md) and no real Qwen3 weights
exist offline, so a sweep on them would measure nothing. The lookup-task probe is not run
either: no model here retrieves on it (the same protocol rows), and on these kv models the
needle sweep is the protocol's long-needle test in the form whose residues we control.

Patterns (MInference's units: key blocks for block-sparse, tokens otherwise), scaled from
MInference's 64-token blocks on 100K+ prompts to a 144-token prompt (docs/sparse_prefill.md has
the full table; results/sparse_prefill/RUN.md the mapping):
- block-sparse, B = 8 (18 blocks): top 2, 4, 8 key blocks (16, 32, 64 tokens; 11, 22, 44% of
  the prompt's blocks); B = 16 (9 blocks): top 2, 4 (32, 64 tokens; 22, 44%); the diagonal
  block counts in ``top`` (MInference: top 100 blocks of 64);
- vertical-slash at B = 8, last_q = 8 (MInference: 64, one block), the first column and the 8
  nearest diagonals always (MInference: 30 and 100): vertical / slash = 4/12, 8/24, 16/48
  tokens (MInference's 1000/6096 keep its 1:6 ratio; here 1:3, since a line is read as up to
  two whole blocks);
- A-shape at B = 8: 4 sink tokens (one block) and a local window of 16, 32, 64 tokens;
- keep-all at B = 8: dense attention through the sparse path (the control).

Cost: training as the eviction sweep's (490-662 s per unit on the loaded machine); the probe,
12 patterns of 1536 rows each, a few minutes per unit.
"""

from configs.sweeps import policy_sweeps

SEEDS = policy_sweeps.SEEDS  # the eviction sweep's models (policy_sweeps.models)
BLOCKS = (8, 16)  # block-sparse block sizes B (tokens)
NEEDLES = dict(num_offsets=48, num_haystacks=32, depths=(0.0,))
LAST_Q = 8


def patterns() -> list[dict]:
  """Every pattern at every budget (the probe's order, the report's rows)."""
  out = [dict(pattern="keep_all", block=8)]
  out += [dict(pattern="block_sparse", block=8, top=k) for k in (2, 4, 8)]
  out += [dict(pattern="block_sparse", block=16, top=k) for k in (2, 4)]
  out += [dict(pattern="vertical_slash", block=8, vertical=v, slash=s, last_q=LAST_Q,
               forced_vertical=1, forced_slash=8) for v, s in ((4, 12), (8, 24), (16, 48))]
  out += [dict(pattern="a_shape", block=8, sink=4, local=w) for w in (16, 32, 64)]
  return out


# The tiny pipeline check's patterns (tests/test_sparse_prefill_sweep.py,
# ``policy_sweeps.tiny``): one of each kind the claims read; nothing it finds is a result.
TINY_PATTERNS = [
    dict(pattern="keep_all", block=4),
    dict(pattern="block_sparse", block=4, top=2),
    dict(pattern="vertical_slash", block=4, vertical=2, slash=4, last_q=4, forced_vertical=1,
         forced_slash=2),
    dict(pattern="a_shape", block=4, sink=2, local=4),
]


def get_config(arg: str = ""):
  return policy_sweeps.get_config(
      "configs/sweeps/sparse_prefill.py", arg, "sparse_prefill", "sparse_needles", NEEDLES,
      dict(patterns=TINY_PATTERNS), patterns=patterns(), prompt_end="answer",
      phase_sizes=BLOCKS)
