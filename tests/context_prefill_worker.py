"""Prefill of a prompt split over mesh.context against one device, then greedy decoding.

Run by tests/test_context_prefill.py in ONE fresh process with 8 fake CPU devices (the device
count is fixed before JAX starts). The model has one layer per attention kind of
tests/context_parallel_worker.py (full; fixed plain and overlapping; DeepSeek-V4 layout with the
lightning indexer's top-k; dynamic with router and with delimiter). From the same parameters
and prompts it runs ``decode.prefill`` on one device and with ``layout=`` a runtime on data 2 x
context 4 (each device holds a quarter of each prompt's tokens), then ``STEPS`` greedy
``decode.step`` calls from each cache, and writes to ``--out`` (npz): the prompt logits, every
cache leaf, the decoded logits and tokens of both, and the token-axis shard length of the
sharded prefill's logits.

  python tests/context_prefill_worker.py --out prefill.npz [--quick]

``--quick`` (the suite's case): the plain fixed layer only.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from chunkformer import decode  # noqa: E402
from chunkformer import runtime as runtime_lib  # noqa: E402
from tests import context_parallel_worker as cp  # noqa: E402

MESH = (2, 1, 4, 1)  # data, fsdp, context, tensor
PROMPT_LEN = 48  # 12 tokens per shard: chunks of 4 and windows of 8 straddle the shard edges
STEPS = 6
MAX_LEN = PROMPT_LEN + STEPS


def prefill_and_decode(rt, params, prompt, layout):
  """{name: array} of one prefill (under ``layout`` or none) and STEPS greedy steps."""
  logits, cache = decode.prefill(rt.model, params, prompt, MAX_LEN, layout=layout)
  out = {"prompt_logits": np.asarray(logits),
         "token_shard": np.int64(logits.sharding.shard_shape(logits.shape)[1])}
  for path, leaf in jax.tree_util.tree_flatten_with_path(cache)[0]:
    out[f"cache{jax.tree_util.keystr(path)}"] = np.asarray(leaf)
  token = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
  steps, tokens = [], []
  for _ in range(STEPS):
    step_logits, cache = decode.step(rt.model, params, cache, token[:, None])
    steps.append(np.asarray(step_logits))
    tokens.append(np.asarray(token))
    token = jnp.argmax(step_logits, axis=-1).astype(jnp.int32)
  out["step_logits"], out["tokens"] = np.stack(steps), np.stack(tokens)
  return out


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", required=True)
  parser.add_argument("--quick", action="store_true", help="the plain fixed layer only")
  args = parser.parse_args()
  layers = (cp.LAYERS["fixed"],) if args.quick else tuple(cp.LAYERS.values())
  devices = jax.devices()
  assert len(devices) == 8, devices
  jax.config.update("jax_disable_most_optimizations", True)  # the compiles are the cost
  one = runtime_lib.build(cp.make_config((1, 1, 1, 1), layers), devices[:1])
  params = jax.device_get(one.fresh_state().params)
  prompt = cp.make_batch(one.config.model.vocab_size)["inputs"][:, :PROMPT_LEN]
  arrays = {f"one/{k}": v for k, v in prefill_and_decode(one, params, prompt, None).items()}
  split = runtime_lib.build(cp.make_config(MESH, layers), devices)
  sharded = jax.device_put(params, split.state_shardings.params)
  arrays.update({f"split/{k}": v
                 for k, v in prefill_and_decode(split, sharded, prompt, split).items()})
  np.savez(args.out, **arrays)


if __name__ == "__main__":
  main()
