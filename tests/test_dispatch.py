"""One capability table decides which implementation serves a layer: config validation, ``auto``
and the runtime all give its answers, written out here by hand, and no other module states a
capability rule."""

from __future__ import annotations

import itertools
import os
import re

import jax.numpy as jnp
import pytest

from chunkformer.attention import dispatch
from chunkformer.config import AttentionConfig, ConfigError, ModelConfig, capabilities

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KV_HEADS = 2

# What serves what, written independently of the table: implementation -> kinds.
SERVED_KINDS = {
    "xla": {"full", "window", "fixed", "dynamic"},
    "blockwise": {"full"},
    "splash": {"full"},
    "pallas_gpu": {"full", "fixed", "dynamic"},
    "pallas_tpu": {"full", "fixed", "dynamic"},
}
# Options of the fixed kind (field name, AttentionConfig overrides) only "xla" serves.
XLA_ONLY_OPTIONS = {
    "topk": dict(topk=2),
    "tail": dict(tail=True, window=0),
    "stagger": dict(stagger="heads"),
}
# auto's choice, per platform and kind.
AUTO = {
    ("cpu", "full"): "blockwise", ("gpu", "full"): "pallas_gpu", ("tpu", "full"): "splash",
    ("cpu", "fixed"): "xla", ("gpu", "fixed"): "pallas_gpu", ("tpu", "fixed"): "pallas_tpu",
    ("cpu", "dynamic"): "xla", ("gpu", "dynamic"): "pallas_gpu",
    ("tpu", "dynamic"): "pallas_tpu",
    ("cpu", "window"): "xla", ("gpu", "window"): "xla", ("tpu", "window"): "xla",
}


def _layer(kind: str, implementation: str, **options) -> AttentionConfig:
  base = dict(window=8) if kind in ("window", "fixed", "dynamic") else {}
  if kind == "dynamic":
    base.update(min_chunk=2, chunk_size=4)
  return AttentionConfig(kind=kind, implementation=implementation, **{**base, **options})


def _validate(attn: AttentionConfig) -> None:
  ModelConfig(num_heads=4, num_kv_heads=KV_HEADS, attention=attn).validate()


@pytest.mark.parametrize("implementation,kind",
                         list(itertools.product(SERVED_KINDS, capabilities.KINDS)))
def test_config_validation_refuses_exactly_the_unserved_kinds(implementation, kind):
  attn = _layer(kind, implementation)
  if kind in SERVED_KINDS[implementation]:
    _validate(attn)
    assert capabilities.refusal(attn, KV_HEADS) is None
  else:
    field = r"'model\.attention\[layer 0\]\.implementation'"
    with pytest.raises(ConfigError, match=field + ".*serves kinds"):
      _validate(attn)


@pytest.mark.parametrize("implementation,field", list(itertools.product(
    ["xla", "pallas_gpu", "pallas_tpu", "auto"], XLA_ONLY_OPTIONS)))
def test_fixed_kind_options_only_xla_serves_are_refused_naming_their_field(implementation,
                                                                           field):
  attn = _layer("fixed", implementation, **XLA_ONLY_OPTIONS[field])
  if implementation in ("xla", "auto"):  # auto finds xla
    _validate(attn)
    return
  with pytest.raises(ConfigError, match=rf"'model\.attention\[layer 0\]\.{field}'.*runs with "
                                        rf"implementation xla, not '{implementation}'"):
    _validate(attn)


def test_per_head_stagger_with_one_kv_head_is_one_chunking_and_runs_on_the_kernels():
  attn = _layer("fixed", "pallas_gpu", stagger="heads")
  ModelConfig(num_heads=4, num_kv_heads=1, attention=attn).validate()


@pytest.mark.parametrize("platform,kind", list(AUTO))
def test_auto_chooses_per_platform(platform, kind):
  attn = _layer(kind, "auto")
  assert dispatch.choose(attn, KV_HEADS, platform) == AUTO[platform, kind]
  resolved = dispatch.resolve(attn, KV_HEADS, platform=platform)
  assert resolved.implementation == AUTO[platform, kind]
  _validate(resolved)  # what auto picks always validates


@pytest.mark.parametrize("field", list(XLA_ONLY_OPTIONS))
@pytest.mark.parametrize("platform", ["cpu", "gpu", "tpu", "cuda", "METAL"])
def test_auto_keeps_xla_for_options_the_kernels_do_not_serve(platform, field):
  attn = _layer("fixed", "auto", **XLA_ONLY_OPTIONS[field])
  assert dispatch.choose(attn, KV_HEADS, platform) == "xla"


def test_xla_serves_every_kind_and_option_so_auto_always_finds_one():
  cap = capabilities.TABLE["xla"]
  assert set(cap.kinds) == set(capabilities.KINDS)
  assert set(cap.options) == set(capabilities.OPTIONS)
  assert all(order[-1] == "xla" for order in capabilities.AUTO.values())


def test_only_xla_splits_rows_over_the_context_axis():
  for name in capabilities.CHOICES:
    refused = capabilities.context_refusal(name, 4)
    assert (refused is None) == (name == "xla"), name
    assert capabilities.context_refusal(name, 1) is None  # no split: anything runs


def test_runtime_refuses_what_the_table_refuses():
  from chunkformer.attention import compressed_core

  q = jnp.zeros((1, 8, 2, 4))
  seg = jnp.zeros((1, 8), jnp.int32)
  entries = dict(entry_k_BxCxKxD=jnp.zeros((1, 2, 2, 4)), entry_v_BxCxKxD=None,
                 entry_ends_BxCxK=jnp.zeros((1, 2, 2), jnp.int32),
                 entry_segment_ids_BxCxK=jnp.zeros((1, 2, 2), jnp.int32), sink_H=None)
  with pytest.raises(ValueError, match="'pallas_gpu' serves kinds"):
    dispatch.compressed_attention(q, q, q, seg, kind="window", window=4, **entries,
                                  implementation="pallas_gpu", interpret=True)
  tail = compressed_core.Tail(4, jnp.zeros((1, 2, 8), jnp.int32))
  with pytest.raises(ValueError, match="tail's raw-token mask runs with implementation xla"):
    dispatch.compressed_attention(q, q, q, seg, kind="fixed", window=0, tail=tail, **entries,
                                  implementation="pallas_tpu", interpret=True)
  with pytest.raises(ValueError, match="resolve 'auto' first"):
    dispatch.full_attention(q, q, q, seg, "auto")


def test_the_capability_rules_live_in_one_module():
  """No module besides the table compares an implementation against a kind or an option, and
  none keeps its own list of which names are Pallas."""
  rule = re.compile(r"implementation (?:==|!=|in|not in) .*(?:kind|topk|tail|stagger)|"
                    r"(?:kind|topk|tail|stagger).*implementation (?:==|!=|in|not in)|"
                    r"PALLAS_BY_PLATFORM|FULL_ONLY_IMPLEMENTATIONS")
  found = []
  for directory, _, files in os.walk(os.path.join(ROOT, "chunkformer")):
    for name in files:
      path = os.path.join(directory, name)
      if not name.endswith(".py") or path.endswith("capabilities.py"):
        continue
      for i, line in enumerate(open(path), 1):
        if rule.search(line):
          found.append(f"{os.path.relpath(path, ROOT)}:{i}: {line.strip()}")
  assert not found, found


def test_the_model_computes_the_row_layout_once_and_every_kernel_call_reads_it(monkeypatch):
  """kind fixed on pallas_gpu (interpret) in a 2-layer scanned model: the model's context holds
  kernels.row_layout of the segment ids, computed outside the layers, and each kernel call
  gets it; an xla model computes none."""
  import jax

  import kernels
  from chunkformer.model import Transformer

  seen = []
  real = kernels.chunk_attention

  def spy(*args, row_layout=None, **kw):
    seen.append(row_layout)
    return real(*args, row_layout=row_layout, **kw)

  monkeypatch.setattr(dispatch.kernels, "chunk_attention", spy)
  seg = jnp.asarray([[0] * 10 + [1] * 14])
  tokens = jnp.zeros((1, 24), jnp.int32)
  for impl in ("pallas_gpu", "xla"):
    seen.clear()
    attn = AttentionConfig(kind="fixed", window=4, chunk_size=4, implementation=impl,
                           interpret=True)
    model = Transformer(ModelConfig(vocab_size=16, num_layers=2, d_model=16, num_heads=2,
                                    num_kv_heads=1, head_dim=8, mlp_dim=32, attention=attn))
    params = model.init(jax.random.PRNGKey(0), tokens, None, seg)
    seen.clear()
    model.apply(params, tokens, None, seg)
    if impl == "xla":
      assert seen == []  # the XLA path never calls the kernels
      continue
    assert len(seen) == 2 and all(r is not None for r in seen)
    want = kernels.row_layout(seg)
    for got in seen:
      for a, b in zip(got, want, strict=True):
        assert (jnp.asarray(a) == b).all()
