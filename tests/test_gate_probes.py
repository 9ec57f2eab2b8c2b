"""The mechanism probes on a tiny W = S model: gate concentration (effective numbers of offsets
from the formulas, from hand-set gates, over kept checkpoints), gate cycling (cycled parameters;
a hand-built model whose weak phase follows its lowest gate bias moves by delta, R^2 = 1), head
knockouts (exact replacement, a silent head, a hand-built single retrieving head) and the
lookup probe end to end."""

from __future__ import annotations

import dataclasses
import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from chunkformer import checkpointing
from chunkformer import config as config_lib
from chunkformer import runtime as runtime_lib
from chunkformer.config import ConfigError
from chunkformer.data import lookup_task
from chunkformer.evaluation.probes import lookup
from chunkformer.evaluation.probes import registry as probe_registry
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.probes.base import ProbeContext
from chunkformer.evaluation.report import figures
from chunkformer.evaluation.sweep import config as sweep_config
from chunkformer.studies.paper.probes import gate_concentration, gate_cycling, head_knockout
from chunkformer.studies.paper.report import mechanism_plots
from configs import smoke

PAPER_STYLE = {"model.attention.kind": "fixed", "model.attention.window": 4,
               "model.attention.chunk_size": 4, "model.attention.offset_maps": "per_offset",
               "model.attention.gate": "scalar", "model.attention.shared_kv": False,
               "model.num_layers": 1}


@pytest.fixture(scope="module")
def tiny():
  """configs/smoke.py with W = S = 4 per-offset scalar gates (1 layer, 2 kv heads, T = 32),
  randomly initialised."""
  raw = sweep_config.apply_overrides(smoke.get_config(), PAPER_STYLE, "test")
  config = config_lib.from_dict(raw.to_dict())
  rt = runtime_lib.build(config)
  return trained_lib.TrainedModel("-", config, rt, nn.meta.unbox(rt.init_state().params), 0)


def _set_gates(params, ape_fn):
  """Zero gate kernels (no content dependence) and ape = ape_fn(stream) in every compressor."""
  def visit(path, leaf):
    names = [str(getattr(k, "key", k)) for k in path]
    if "wgate" in names:
      return np.zeros_like(leaf)
    if "ape" in names:
      stream = next(n for n in names if n.endswith("compressor"))
      return np.broadcast_to(ape_fn(stream), leaf.shape).astype(leaf.dtype)
    return leaf
  return jax.tree_util.tree_map_with_path(visit, params)


def test_concentration_from_the_formulas():
  w = 4
  one_hot = np.eye(w)[[2] * 10]
  assert gate_concentration.concentration(one_hot) == (1.0, 1.0)
  assert gate_concentration.concentration(np.full((5, w), 1 / w)) == pytest.approx((w, w))
  # one-hot in every window, a different offset each time: uniform on average
  rotating = np.eye(w)[np.arange(12) % w]
  assert gate_concentration.concentration(rotating) == pytest.approx((w, 1.0))
  # two windows, each half on two offsets: exp(H) = 2 per window; the average is uniform
  halves = np.array([[0.5, 0.5, 0, 0], [0, 0, 0.5, 0.5]])
  assert gate_concentration.concentration(halves) == pytest.approx((4.0, 2.0))


def test_hand_set_gates_of_a_real_model_give_one_and_w(tiny, tmp_path):
  uniform = dataclasses.replace(tiny, params=_set_gates(tiny.params, lambda s: 0.0))
  rows = {k: np.broadcast_to(np.arange(32) % 20 + 3, (4, 32)).astype(np.int32) for k in
          trained_lib.ROW_KEYS}
  rows["positions"] = np.broadcast_to(np.arange(32), (4, 32)).astype(np.int32)
  rows["segment_ids"] = np.zeros((4, 32), np.int32)
  gates = gate_concentration.measure(uniform, rows, batch_size=4)
  assert [(g["layer"], g["stream"], g["head"]) for g in gates] == [
      (0, s, h) for s in ("k", "v") for h in (0, 1)]
  for g in gates:
    assert g["window"] == 4 and g["windows"] == 4 * 8  # 4 rows x 8 complete windows
    assert g["static"] == pytest.approx(4.0, abs=1e-5)
    assert g["per_window"] == pytest.approx(4.0, abs=1e-5)
  # key gates: bias 40 at offset 2 -> one-hot; value gates stay uniform
  bias = np.array([0.0, 0.0, 40.0, 0.0])[:, None]
  peaked = dataclasses.replace(tiny, params=_set_gates(
      tiny.params, lambda s: (bias.T if s == "key_compressor" else np.zeros((1, 4)))[:, None]))
  for g in gate_concentration.measure(peaked, rows, batch_size=4):
    want = 1.0 if g["stream"] == "k" else 4.0
    assert g["static"] == pytest.approx(want, abs=1e-5)
    assert g["per_window"] == pytest.approx(want, abs=1e-5)
    if g["stream"] == "k":
      assert np.argmax(g["mean_alpha"]) == 2
  path = mechanism_plots.plot_concentration_plane(tmp_path / "plane.png", gates, title="tiny")
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_the_probe_reads_the_random_model_on_its_own_heldout_rows(tiny, tmp_path):
  context = ProbeContext(tiny, None, "tiny", (4,))
  result = probe_registry.PROBES["gate_concentration"](context, rows=8, batch_size=4)
  record = result.record
  assert [os.path.basename(p) for p in figures.draw(result.figures, str(tmp_path)).values()] == [
      "tiny_gate_concentration.png"]
  assert record["rows"] == 8 and len(record["gates"]) == 4
  for g in record["gates"]:  # random content-dependent gates: between one-hot and uniform,
    assert 1.0 <= g["per_window"] <= g["static"] + 1e-6 <= 4.0 + 1e-6  # concave entropy
    assert g["windows"] == 8 * 8


def test_cycling_moves_every_gate_parameter_and_nothing_else(tiny):
  params = tiny.params
  cycled = gate_cycling.cycle_gates(params, 1, 4)
  back = gate_cycling.cycle_gates(cycled, -1, 4)
  jax.tree.map(np.testing.assert_array_equal, back, params)
  for layer in ("block_0",):
    for stream in ("key_compressor", "value_compressor"):
      old, new = params[layer]["attn"][stream], cycled[layer]["attn"][stream]
      for i in range(4):  # offset (i + 1) mod 4 gets offset i's Z_i and b_i (scalar gates)
        np.testing.assert_array_equal(new["wgate"]["kernel"][..., (i + 1) % 4],
                                      old["wgate"]["kernel"][..., i])
        np.testing.assert_array_equal(new["ape"][..., (i + 1) % 4], old["ape"][..., i])
      np.testing.assert_array_equal(new["wkv"]["kernel"], old["wkv"]["kernel"])
  with pytest.raises(ConfigError, match="compress_window': gate cycling needs W = S"):
    gate_cycling.check_cyclable(dataclasses.replace(
        tiny.config.model, attention=dataclasses.replace(tiny.config.model.attention,
                                                         compress_window=8)))


def _weak_where_the_bias_is_lowest(spec):
  """A hand-built model: it answers every query except those whose target key sits at the
  phase where layer 0's key gate bias (head 0) is lowest."""
  def predict_with(params, rows):
    ape = np.asarray(params["block_0"]["attn"]["key_compressor"]["ape"])[0, 0]
    weak = int(np.argmin(ape))
    out = np.zeros_like(rows["inputs"])
    for i, row in enumerate(rows["inputs"]):
      t_k = int(np.argmax(row == row[-1]))
      if t_k % 4 != weak:
        out[i, -1] = row[t_k + 1]
    return out
  return predict_with


def test_cycling_a_hand_set_gate_moves_the_weak_phase_by_delta(tiny):
  ape = np.array([0.0, -3.0, 0.0, 0.0])  # phase 1 is weak
  params = _set_gates(tiny.params, lambda s: ape[None, :])
  spec = lookup_task.LookupSpec(seq_len=32, keys=tuple(range(10, 18)),
                                values=tuple(range(18, 26)), filler=3, bos=1, num_records=3,
                                num_demos=2, modulus=4, prompts_per_residue=16)
  prompts = lookup_task.generate(spec, 0)
  accuracy, outcomes = gate_cycling.accuracy_by_delta(
      params, _weak_where_the_bias_is_lowest(spec), prompts, (1, -1, 2), 4)
  np.testing.assert_array_equal(accuracy[0], [1, 0, 1, 1])
  np.testing.assert_array_equal(accuracy[1], [1, 1, 0, 1])  # the weak phase moved by +1
  np.testing.assert_array_equal(accuracy[-1], [0, 1, 1, 1])
  np.testing.assert_array_equal(accuracy[2], [1, 1, 1, 0])  # now at the boundary phase 3
  assert outcomes[1].shape == (16, 4)
  result = gate_cycling.analyse(accuracy, 4)
  assert result.r_squared == pytest.approx(1.0)
  assert result.boundary == {0: 1.0, 1: 1.0, -1: 1.0, 2: 0.0}
  # weak phases moving the other way: by hand, observed changes [1, 0, 0, 1, 0, 0] against
  # predicted [1, -1, -1, 1, 0, 0] (boundary pairs left out): R^2 = 1 - 2 / (4/3) = -0.5
  opposite = {0: accuracy[0], 1: accuracy[-1], -1: accuracy[1], 2: accuracy[2]}
  assert gate_cycling.analyse(opposite, 4).r_squared == pytest.approx(-0.5)
  frozen = {d: accuracy[0] for d in accuracy}  # nothing moves: no variation to explain
  assert gate_cycling.analyse(frozen, 4).r_squared is None


def test_the_cycling_probe_runs_on_the_real_model(tiny, tmp_path):
  context = ProbeContext(tiny, None, "tiny", (4,))
  result = probe_registry.PROBES["gate_cycling"](context, deltas=(1,), batch_size=32)
  assert [os.path.basename(p) for p in figures.draw(result.figures, str(tmp_path)).values()] == [
      "tiny_gate_cycling.png"]
  record = result.record
  assert record["stride"] == 4 and record["deltas"] == [1]
  assert set(record["accuracy"]) == {"0", "1"} and len(record["accuracy"]["1"]) == 4
  assert set(record["boundary"]) == {"0", "1"}
  assert result.matrices["delta+1"].correct_YxJ.shape == (16, 4)
  np.testing.assert_allclose(result.matrices["delta0"].correct_YxJ.mean(axis=0),
                             record["accuracy"]["0"])
  with pytest.raises(ConfigError, match="deltas': \\[4\\] holds a multiple of the stride 4"):
    gate_cycling.probe(context, deltas=(4,))


def _rows(n=4):
  rng = np.random.default_rng(0)
  return {"inputs": rng.integers(3, 23, (n, 32)).astype(np.int32),
          "positions": np.broadcast_to(np.arange(32), (n, 32)).astype(np.int32),
          "segment_ids": np.zeros((n, 32), np.int32)}


def test_a_knockout_replaces_exactly_the_final_outputs_of_its_heads(tiny):
  knockout = head_knockout.Knockout(tiny, batch_size=4)
  rows = _rows()
  means, nothing = knockout.nothing()
  clean_preds, heads, clean_logits = knockout.run(rows, means, nothing)
  assert heads.shape == (4, 1, 2, 16)
  # replacing a head's output by its own value changes nothing (one prompt: its own mean)
  mask = np.ones((1, 2), bool)
  for i in range(4):
    one = {k: v[i:i + 1] for k, v in rows.items()}
    _, _, logits = knockout.run(one, heads[i], mask)
    np.testing.assert_allclose(logits[0], clean_logits[i], atol=1e-5)
  # another value at KV head 0 moves the final logits and nothing before the final position
  mask = np.array([[True, False]])
  preds, _, logits = knockout.run(rows, heads[::-1].mean(axis=0) * 0 + 3.0, mask)
  assert np.abs(logits - clean_logits).max() > 1e-3
  np.testing.assert_array_equal(preds[:, :-1], clean_preds[:, :-1])


def test_knocking_out_a_head_that_carries_nothing_changes_nothing(tiny):
  params = jax.tree.map(np.array, tiny.params)
  params["block_0"]["attn"]["out"]["o"]["kernel"][1] = 0.0  # query head 1 = KV head 1 unread
  # placed like the trained params, so the compiled forward pass is reused
  params = jax.tree.map(lambda x, ref: jax.device_put(x, ref.sharding), params, tiny.params)
  silent = dataclasses.replace(tiny, params=params)
  knockout = head_knockout.Knockout(silent, batch_size=4)
  rows = _rows()
  _, heads, clean = knockout.run(rows, *knockout.nothing())
  _, _, knocked = knockout.run(rows, heads.mean(axis=0) + 5.0, np.array([[False, True]]))
  np.testing.assert_array_equal(knocked, clean)
  assert head_knockout.query_heads(1, num_heads=16, num_kv_heads=4) == [4, 5, 6, 7]


def test_the_knockout_probe_maps_every_head_by_residue(tiny, tmp_path):
  context = ProbeContext(tiny, None, "tiny", (4,))
  result = probe_registry.PROBES["head_knockout"](context, modulus=4, batch_size=4)
  record = result.record
  assert [(h["layer"], h["kv_head"]) for h in record["heads"]] == [(0, 0), (0, 1)]
  for h in record["heads"]:
    np.testing.assert_allclose(np.array(h["accuracy"]) - record["clean"], h["change"])
  assert result.matrices["L0H1"].correct_YxJ.shape == (16, 4)
  with pytest.raises(ConfigError, match="calibration_seed'"):
    head_knockout.probe(context, seed=3, calibration_seed=3)
  # the probe describes its map; the report layer draws it into the sweep's plots folder
  images = figures.draw(result.figures, str(tmp_path))
  assert list(images) == ["tiny: KV-head knockout map (accuracy change by residue)"]
  with open(images[next(iter(images))], "rb") as f:
    assert f.read(4) == b"\x89PNG"


class _OneRetrievingHead:
  """A hand-built two-head model: KV head 0 alone retrieves, and only for target keys at phase
  1 of 4; KV head 1 carries nothing. ``mask`` marks the knocked-out query heads."""

  layers, heads = 1, 2

  def final_heads(self, rows):
    return np.zeros((rows["inputs"].shape[0], 1, 2, 1))

  def predict(self, rows, means=None, mask=None):
    out = np.zeros_like(rows["inputs"])
    if mask is not None and mask[0, 0]:
      return out
    for i, row in enumerate(rows["inputs"]):
      t_k = int(np.argmax(row == row[-1]))
      if t_k % 4 == 1:
        out[i, -1] = row[t_k + 1]
    return out


def test_knocking_out_the_only_retrieving_head_drops_accuracy_at_its_phase():
  spec = lookup_task.LookupSpec(seq_len=32, keys=tuple(range(10, 18)),
                                values=tuple(range(18, 26)), filler=3, bos=1, num_records=3,
                                num_demos=2, modulus=8, prompts_per_residue=64)
  prompts, calibration = lookup_task.generate(spec, 0), lookup_task.generate(spec, 1)
  found = head_knockout.knockout_map(_OneRetrievingHead(), prompts, calibration, kv_heads=2)
  by_residue = lambda right: right.reshape(8, -1).mean(axis=1)  # noqa: E731
  np.testing.assert_array_equal(by_residue(found["clean"]), [0, 1, 0, 0, 0, 1, 0, 0])
  np.testing.assert_array_equal(by_residue(found["knocked"][(0, 0)]), np.zeros(8))
  np.testing.assert_array_equal(found["knocked"][(0, 1)], found["clean"])


def test_the_trajectory_reads_every_kept_checkpoint(tiny, tmp_path):
  state = tiny.runtime.init_state()
  bias = np.array([[0.0, 0.0, 40.0, 0.0]])[:, None]
  checkpointer = checkpointing.Checkpointer(str(tmp_path), tiny.config.train)
  for step, ape in ((1, lambda s: 0.0), (2, lambda s: bias if s == "key_compressor" else 0.0)):
    params = jax.tree.map(lambda x, ref: jax.device_put(np.asarray(x), ref.sharding),
                          _set_gates(state.params, ape), state.params)
    checkpointer.save(step, state.replace(params=params), force=True)
    checkpointer.wait()
  checkpointer.close()
  trained = dataclasses.replace(tiny, workdir=str(tmp_path))
  record = gate_concentration.probe(ProbeContext(trained, None, "tiny", (4,)), rows=4,
                                    batch_size=4, trajectory=True).record
  assert [t["step"] for t in record["trajectory"]] == [1, 2]
  first, last = ({g["stream"]: g for g in t["gates"]} for t in record["trajectory"])
  assert first["k"]["static"] == pytest.approx(4.0, abs=1e-5)
  assert last["k"]["static"] == pytest.approx(1.0, abs=1e-5)
  assert last["v"]["per_window"] == pytest.approx(4.0, abs=1e-5)
  with pytest.raises(ConfigError, match="trajectory': workdir .* holds no checkpoints"):
    gate_concentration.probe(ProbeContext(dataclasses.replace(tiny, workdir=str(
        tmp_path / "none")), None, "tiny", (4,)), rows=4, batch_size=4, trajectory=True)


def test_the_lookup_probe_runs_on_the_real_model(tiny):
  """End to end through the real predictor (the batch size the cycling probe compiles)."""
  context = ProbeContext(tiny, trained_lib.Predictor(tiny, 32), "tiny", (4,))
  result = probe_registry.PROBES["lookup"](context, modulus=4)
  test = lookup.ResidueTest.from_record(result.record)
  assert test.settings == {"num_records": 3, "num_demos": 2, "seed": 2609,
                           "positions": "moments", "distinct_values": False}
  assert test.validation_loss is None and test.stride == 4
  for padding in ("prefix", "in_sequence"):
    table = test.modes[padding]
    assert table.total == (16,) * 4 and 0.0 <= table.mean <= 1.0
    assert table.stride_repeat is None  # stride 4 = modulus 4: nothing to repeat
    assert all(lo <= a <= hi for lo, a, hi in zip(table.low, table.accuracy, table.high,
                                                  strict=True))
    assert result.matrices[padding].correct_YxJ.shape == (16, 4)
