"""decode.prefill under the mesh's context axis: a prompt split over 4 devices (data 2 x
context 4 on 8 fake CPU devices) leaves the same cache and logits as one device, and greedy
decoding from that cache gives the same logits and tokens (tests/context_prefill_worker.py,
one fresh process). The suite runs a fixed layer (about 13 s of CPU, mostly JAX's start and
four compiles); CHUNKFORMER_SLOW_TESTS=1 runs one layer of every attention kind (full; fixed
plain and overlapping; V4 layout with the lightning indexer's top-k; dynamic with router and
delimiter). The refusals run in this process, before anything compiles."""

import os

import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh

from chunkformer import decode
from chunkformer import sharding as sharding_lib
from chunkformer.config_sections.mesh import DEFAULT_AXIS_RULES
from chunkformer.model import Transformer
from tests import context_parallel_worker as cp
from tests import context_prefill_worker as worker
from tests import fake_devices

SLOW = os.environ.get("CHUNKFORMER_SLOW_TESTS") == "1"
CASES = [pytest.param(False, id="fixed"),
         pytest.param(True, id="every_kind", marks=pytest.mark.skipif(
             not SLOW, reason="six kinds: minutes of compiles; CHUNKFORMER_SLOW_TESTS=1"))]


@pytest.fixture(scope="module", params=CASES)
def arrays(request, tmp_path_factory):
  out = tmp_path_factory.mktemp("context_prefill") / "prefill.npz"
  flags = [] if request.param else ["--quick"]
  fake_devices.run([worker.__file__, "--out", out, *flags], devices=8, timeout=600)
  with np.load(out) as f:
    return dict(f, layers=len(cp.LAYERS) if request.param else 1)


def test_the_sharded_prefill_splits_the_prompt_tokens_over_context(arrays):
  context = worker.MESH[2]
  assert arrays["one/token_shard"] == worker.PROMPT_LEN
  assert arrays["split/token_shard"] == worker.PROMPT_LEN // context


def test_sharded_prefill_leaves_the_same_cache_and_logits_as_one_device(arrays):
  one = {k.removeprefix("one/"): v for k, v in arrays.items() if k.startswith("one/")}
  caches = [k for k in one if k.startswith("cache")]
  # every layer's cache (one layer per kind) holds something the prompt wrote
  assert len({k.split("]")[0] for k in caches}) == arrays["layers"]
  for key in ["prompt_logits", *caches]:
    np.testing.assert_allclose(arrays[f"split/{key}"], one[key], atol=1e-5, rtol=0, err_msg=key)


def test_decoding_after_a_sharded_prefill_equals_one_device(arrays):
  np.testing.assert_allclose(arrays["split/step_logits"], arrays["one/step_logits"], atol=1e-5,
                             rtol=0)
  np.testing.assert_array_equal(arrays["split/tokens"], arrays["one/tokens"])
  assert arrays["one/step_logits"].shape[0] == worker.STEPS


class _Layout:
  """What prefill reads of a runtime: a mesh (abstract here: the refusals come before any
  device is touched) and the axis rules."""

  def __init__(self, data, context):
    self.mesh = AbstractMesh((data, 1, context, 1), sharding_lib.MESH_AXES)
    self.rules = DEFAULT_AXIS_RULES


@pytest.mark.parametrize("layer,rows,length,data,context,match", [
    ("kind=full", 1, 9, 1, 1, "prompt of 9 tokens exceeds max_len 8"),
    ("kind=full", 1, 5, 1, 2, r"prompt of 5 tokens does not split over mesh.context=2"),
    ("kind=full", 3, 4, 2, 2, r"prompt of 3 rows does not split over the 2 batch shards"),
    ("kind=fixed,window=8,implementation=pallas_tpu", 1, 4, 1, 2,
     r"model.attention\[layer 0\].implementation: 'pallas_tpu' cannot split a prompt"),
])
def test_prefill_refuses_what_the_mesh_cannot_split_before_tracing(layer, rows, length, data,
                                                                   context, match):
  # params None: any trace would fail with another error, so the refusal comes first
  model = Transformer(cp.make_config((1, 1, 1, 1), (layer,)).model)
  with pytest.raises(ValueError, match=match):
    decode.prefill(model, None, jnp.zeros((rows, length), jnp.int32), 8,
                   layout=_Layout(data, context))
