"""model.query_shift: the key shift's width applied to queries as well.

A shifted query at t reads the hidden states of t-1 .. t-w+1 of its own document (and nothing
later, nothing from another document); at its zero init the model is the key-shift-only model.
Configs that could not mean it are refused by name, and the sweep records it. Decoding with it
is checked with the other layouts in tests/test_decode.py.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from chunkformer.attention.common import QKVProjection
from chunkformer.config import ConfigError, ModelConfig
from chunkformer.context import AttentionContext
from chunkformer.evaluation.records.variant import VariantSetup

E, T, WIDTH = 16, 8, 3


def _model(query_shift=True, key_shift=WIDTH):
  return ModelConfig(vocab_size=32, num_layers=1, d_model=E, num_heads=2, num_kv_heads=1,
                     head_dim=8, mlp_dim=32, key_shift=key_shift, query_shift=query_shift)


def _ctx(segment_ids):
  seg = jnp.asarray([segment_ids], jnp.int32)
  return AttentionContext(jnp.zeros_like(seg), jnp.arange(T)[None], seg)


def _queries(model, x, ctx, scale):
  """q of a QKVProjection whose token shifts are N(0, scale^2) instead of their zero init."""
  layer = QKVProjection(model)
  params = jax.tree_util.tree_map_with_path(
      lambda path, p: (jax.random.normal(jax.random.key(len(str(path))), p.shape) * scale
                       if "shift" in str(path) else p),
      layer.init(jax.random.key(0), x, ctx)["params"])
  return layer.apply({"params": params}, x, ctx)[0]


def _perturbed(x, t):
  return x.at[0, t].add(1.0)


def test_a_shifted_query_reads_its_documents_predecessors_and_nothing_else():
  x = jax.random.normal(jax.random.key(1), (1, T, E))
  one_doc = _ctx([0] * T)
  q = _queries(_model(), x, one_doc, 0.5)
  for t in range(1, T):  # changing token t-1 changes queries t-1 .. t+WIDTH-2 only
    changed = np.abs(_queries(_model(), _perturbed(x, t - 1), one_doc, 0.5) - q).max(axis=(2, 3))
    reach = np.arange(T)
    np.testing.assert_array_equal(changed[0] > 1e-6, (reach >= t - 1) & (reach < t + WIDTH - 1))
  # the document starting at 4 does not see token 3 through the shift
  two_docs = _ctx([0, 0, 0, 0, 1, 1, 1, 1])
  base = _queries(_model(), x, two_docs, 0.5)
  changed = np.abs(_queries(_model(), _perturbed(x, 3), two_docs, 0.5) - base).max(axis=(2, 3))
  np.testing.assert_array_equal(changed[0] > 1e-6, np.arange(T) == 3)
  # without the flag a query is its own token's only
  plain = _queries(_model(query_shift=False), x, one_doc, 0.5)
  changed = np.abs(_queries(_model(query_shift=False), _perturbed(x, 2), one_doc, 0.5) - plain)
  np.testing.assert_array_equal(changed.max(axis=(2, 3))[0] > 1e-6, np.arange(T) == 2)


def test_at_its_zero_init_the_queries_are_the_key_shift_only_models():
  x = jax.random.normal(jax.random.key(2), (1, T, E))
  ctx = _ctx([0] * T)
  both = QKVProjection(_model())
  params = both.init(jax.random.key(0), x, ctx)["params"]
  assert set(params["query_shift"]) == {"shift_1", "shift_2"}  # width - 1 matrices
  keys_only = {k: v for k, v in params.items() if k != "query_shift"}
  chex.assert_trees_all_close(both.apply({"params": params}, x, ctx),
                              QKVProjection(_model(query_shift=False)).apply(
                                  {"params": keys_only}, x, ctx))


@pytest.mark.parametrize("key_shift", [0, 1])
def test_a_query_shift_without_a_key_shift_width_is_refused_by_field(key_shift):
  with pytest.raises(ConfigError, match="model.query_shift"):
    _model(key_shift=key_shift).validate()


def test_records_carry_the_query_shift_and_older_files_read_back_without_it():
  keys_only = VariantSetup("fixed_m4_kv2_shift3", "fixed", "fixed+shift3", key_shift=True,
                           key_shift_width=3)
  assert "query_shift" not in keys_only.to_json()  # such files are written as before
  assert VariantSetup.from_json(keys_only.to_json()) == keys_only
  both = VariantSetup("fixed_m4_kv2_qkshift3", "fixed", "fixed+qkshift3", key_shift=True,
                      key_shift_width=3, query_shift=True)
  assert both.to_json()["query_shift"] is True
  assert VariantSetup.from_json(both.to_json()) == both
