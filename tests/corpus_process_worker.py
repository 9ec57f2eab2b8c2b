"""Builds the corpus runtime in one of two processes and writes the rows this process feeds.

Run by tests/test_corpus.py (two processes, ``jax.distributed`` through the CHUNKFORMER_*
variables, one CPU device each):

  python tests/corpus_process_worker.py --path SHARDS --out rows_I.json
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from chunkformer import distributed  # noqa: E402


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--path", required=True)
  parser.add_argument("--out", required=True)
  args = parser.parse_args()
  distributed.initialize()

  import jax  # noqa: PLC0415 -- after jax.distributed

  from chunkformer import config as config_lib  # noqa: PLC0415
  from chunkformer import runtime as runtime_lib  # noqa: PLC0415

  config = config_lib.from_dict({
      "model": {"vocab_size": 260, "num_layers": 1, "d_model": 16, "num_heads": 1,
                "num_kv_heads": 1, "head_dim": 16, "mlp_dim": 16},
      "data": {"task": "corpus", "path": args.path, "seq_len": 32, "batch_size": 4,
               "read_threads": 1}})
  rt = runtime_lib.build(config)
  batches = [rt.feed.batch("train", step) for step in range(3)]
  global_batch = rt.batch("train", 3)  # the sharded global array assembles from both halves
  rt.feed.close()
  with open(args.out, "w") as f:
    json.dump({"process": jax.process_index(), "row_block": list(rt.row_block),
               "global_shape": list(global_batch["inputs"].shape),
               "rows": [b["inputs"].tolist() for b in batches]}, f)


if __name__ == "__main__":
  main()
