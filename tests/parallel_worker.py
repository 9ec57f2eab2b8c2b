"""Trains the smoke config for a few steps and writes its per-step training losses as JSON.

Run by tests/test_parallel.py in fresh processes, because the device count (XLA_FLAGS) and
``jax.distributed`` must be fixed before JAX starts. Multi-process runs take the CHUNKFORMER_*
environment variables (chunkformer/distributed.py); only process 0 writes ``--out``.

  python tests/parallel_worker.py --out losses.json --workdir DIR --mesh 2,2,2[,1] [--devices 1]
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from chunkformer import distributed  # noqa: E402


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", required=True)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--mesh", default="-1,1,1", help="data,fsdp,tensor[,context]")
  parser.add_argument("--devices", type=int, default=0, help="use the first N devices; 0 = all")
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--num_kv_heads", type=int, default=1)
  args = parser.parse_args()
  distributed.initialize()

  import jax  # noqa: PLC0415 -- after jax.distributed

  from chunkformer import config as config_lib  # noqa: PLC0415
  from chunkformer import trainer  # noqa: PLC0415
  from configs import smoke  # noqa: PLC0415

  c = smoke.get_config()
  c.model.num_kv_heads = args.num_kv_heads
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor, *context = (int(x) for x in args.mesh.split(","))
  c.mesh.context = context[0] if context else 1
  c.train.steps = args.steps
  c.train.log_every = 1
  config = config_lib.from_dict(c.to_dict())

  losses = {}

  def hook(p: trainer.Progress) -> None:
    if p.split == "train":
      losses[p.step] = p.metrics["loss"]

  devices = jax.devices()[: args.devices] if args.devices else None
  final = trainer.train(config, args.workdir, progress=hook, devices=devices)
  if jax.process_index() == 0:
    with open(args.out, "w") as f:
      json.dump({"losses": [losses[s] for s in sorted(losses)], "final": final,
                 "devices": len(devices or jax.devices()), "processes": jax.process_count()}, f)


if __name__ == "__main__":
  main()
