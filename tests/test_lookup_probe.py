"""The lookup and long needle probes: residue statistics against hand computations, a
hand-built model that retrieves at chosen phases only, Wilson intervals against the closed
form and the paper's published intervals (the run on a real model: test_gate_probes.py)."""

from __future__ import annotations

import json
import math
import types

import numpy as np
import pytest

from chunkformer.config import ConfigError, DataConfig
from chunkformer.data import lookup_task
from chunkformer.evaluation.probes import lookup
from chunkformer.evaluation.probes import registry as probe_registry
from chunkformer.evaluation.probes.base import ProbeContext
from chunkformer.evaluation.report import probe_tables
from chunkformer.evaluation.stats import residue_accuracy
from chunkformer.studies.paper.records import published
from chunkformer.studies.paper.report import residue_tables

KV = DataConfig(seq_len=96, num_pairs=4, key_len=1, value_len=1, num_queries=1, num_symbols=16)


def _retrieves_at(residues, modulus, answer_position=-1):
  """A hand-built model: answers the query (the last token) right iff the first occurrence of
  the query's key in the row sits at a position whose residue mod ``modulus`` is listed;
  otherwise it predicts token 0."""
  def predict(rows):
    tokens = rows["inputs"]
    out = np.zeros_like(tokens)
    for i, row in enumerate(tokens):
      t_k = int(np.argmax(row == row[answer_position]))
      if t_k % modulus in residues:
        out[i, answer_position] = row[t_k + 1]
    return {"predictions": out}
  return predict


def _context(predict, data=KV, workdir="-"):
  trained = types.SimpleNamespace(config=types.SimpleNamespace(data=data), workdir=workdir)
  return ProbeContext(trained, predict, "unit", (4,))


def _wilson_closed_form(k, n, z=1.959963984540054):
  p = k / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
  return centre - half, centre + half


def test_a_model_retrieving_at_two_residues_gives_the_hand_computed_table(tmp_path):
  with open(tmp_path / "final_metrics.json", "w") as f:
    json.dump({"step": 10, "heldout": {"loss": 2.5}}, f)
  # retrieves at phase 1 of stride 4 (residues 1 and 5 of 8), and at residue 6 too
  context = _context(_retrieves_at({1, 5, 6}, 8), workdir=str(tmp_path))
  result = probe_registry.PROBES["lookup"](context, modulus=8, num_records=6, num_demos=2)
  test = lookup.ResidueTest.from_record(result.record)
  assert test.validation_loss == 2.5 and test.stride == 4 and test.prompts_per_residue == 64
  for padding in ("prefix", "in_sequence"):
    table = test.modes[padding]
    assert table.accuracy == (0, 1, 0, 0, 0, 1, 1, 0) and table.total == (64,) * 8
    assert table.mean == pytest.approx(3 / 8)
    assert (table.worst, table.worst_residue, table.best, table.best_residue) == (0, 0, 1, 1)
    assert table.gap == 1.0
    assert table.stride_repeat == pytest.approx((0 + 0 + 1 + 0) / 4)  # |A(2) - A(6)| only
    assert table.low[0] == 0.0 and table.high[1] == 1.0
    matrix = result.matrices[padding]
    assert matrix.correct_YxJ.shape == (64, 8)
    np.testing.assert_array_equal(matrix.correct_YxJ.mean(axis=0), table.accuracy)
  assert json.loads(json.dumps(result.record)) == result.record


def test_the_long_needle_probe_scores_every_answer_token():
  data = DataConfig(seq_len=200, num_pairs=4, key_len=1, value_len=1, num_queries=1,
                    num_symbols=16)

  def predict(rows):  # right at residues 0..3 of 8; the second answer token always wrong
    out = _retrieves_at({0, 1, 2, 3}, 8, answer_position=-2)(rows)["predictions"]
    return {"predictions": out}
  result = lookup.needle_probe(_context(predict, data), modulus=8)
  assert result.record["modes"]["needle"]["accuracy"] == [0.0] * 8  # every prompt has 2 tokens

  def both(rows):
    tokens = rows["inputs"]
    out = np.zeros_like(tokens)
    for i, row in enumerate(tokens):
      t_k = next(t for t in range(len(row)) if row[t] == row[-3] and row[t + 1] == row[-2])
      if t_k % 8 < 4:
        out[i, -2:] = row[t_k + 2:t_k + 4]
    return {"predictions": out}
  result = lookup.needle_probe(_context(both, data), modulus=8)
  table = result.record["modes"]["needle"]
  assert table["accuracy"] == [1.0] * 4 + [0.0] * 4 and table["gap"] == 1.0
  assert table["stride_repeat"] == 1.0  # stride 4: A(r) and A(r + 4) always differ


def test_wilson_intervals_match_the_closed_form_and_the_papers_published_ones():
  for k, n in ((112, 256), (81, 263), (5, 9)):
    np.testing.assert_allclose(residue_accuracy.wilson(k, n), _wilson_closed_form(k, n),
                               atol=1e-12)
  # all wrong: [0, z^2 / (n + z^2)]
  z2 = 1.959963984540054**2
  np.testing.assert_allclose(residue_accuracy.wilson(0, 10), (0.0, z2 / (10 + z2)), atol=1e-12)
  # DeepSeek-V4-Flash-Base, residue 0 and 3 of the published long needle test (percent)
  assert [round(100 * x, 2) for x in residue_accuracy.wilson(112, 256)] == [37.81, 49.87]
  assert [round(100 * x, 2) for x in residue_accuracy.wilson(76, 256)] == [24.42, 35.55]
  with pytest.raises(ValueError, match=">= 1 trial"):
    residue_accuracy.wilson(0, 0)


def test_the_stride_repeat_check_needs_a_stride_that_divides_the_modulus():
  acc = np.array([0.2, 0.5, 0.9, 0.4, 0.3, 0.5, 0.7, 0.4])
  assert residue_accuracy.stride_repeat(acc, 4) == pytest.approx((0.1 + 0 + 0.2 + 0) / 4)
  assert residue_accuracy.stride_repeat(acc, 8) is None
  assert residue_accuracy.stride_repeat(acc, 3) is None


def test_bad_options_are_config_errors_naming_the_probe():
  context = _context(_retrieves_at({0}, 8))
  with pytest.raises(ConfigError, match=r"'sweep\.probes\.lookup': padding: 'middle'"):
    lookup.probe(context, modulus=8, num_records=4, num_demos=1, paddings=("middle",))
  with pytest.raises(ConfigError, match=r"'sweep\.probes\.lookup': prompts_per_residue: 10"):
    lookup.probe(context, modulus=8, prompts_per_residue=10)
  corpus = types.SimpleNamespace(task="corpus", seq_len=96)
  with pytest.raises(ConfigError, match=r"'sweep\.probes\.long_needle': task 'corpus'"):
    lookup.needle_probe(_context(_retrieves_at({0}, 8), corpus))
  short = DataConfig(seq_len=20, num_pairs=1, num_queries=1, key_len=1, value_len=1)
  with pytest.raises(ConfigError, match=r"'sweep\.probes\.lookup': seq_len: 20 tokens"):
    lookup.probe(_context(_retrieves_at({0}, 8), short), modulus=8)
  probe_registry.check({"lookup": {"modulus": 8}, "long_needle": {"key_len": 3}})
  with pytest.raises(ConfigError, match=r"'sweep\.probes\.lookup': .*modulo"):
    probe_registry.check({"lookup": {"modulo": 8}})
  # a prompt count the matched design cannot use is refused before anything trains, at each
  # probe's own modulus (head_knockout's default 8 needs multiples of 64); the shifted
  # design takes any count
  for name, options in (("head_knockout", {"prompts_per_residue": 16}),
                        ("lookup", {"modulus": 8, "prompts_per_residue": 10}),
                        ("long_needle", {"prompts_per_residue": 32})):
    with pytest.raises(ConfigError, match=rf"'sweep\.probes\.{name}': prompts_per_residue: "
                                          r"\d+ prompts per residue cannot match"):
      probe_registry.check({name: options})
  probe_registry.check({"lookup": {"modulus": 8, "prompts_per_residue": 10,
                                   "positions": "shift"},
                        "head_knockout": {"prompts_per_residue": 64}})
  with pytest.raises(ConfigError, match=r"'sweep\.probes\.eviction_lookup': prompts_per_resi"):
    probe_registry.check({"eviction_lookup": {"modulus": 8, "prompts_per_residue": 16,
                                              "policies": [{"policy": "snapkv", "budget": 64}]}})


def test_the_report_table_shows_our_rows_and_the_papers_beside_a_paper_run():
  context = _context(_retrieves_at({1, 5, 6}, 8))
  record = lookup.probe(context, modulus=8, num_records=6, num_demos=2).record
  text = residue_tables.section([("w8s8_1kv", record)])
  assert "| w8s8_1kv | lookup | prefix | - | 37.5 | 0.0 (0) | 100.0 |\n" in text
  assert "1: 100.0 [94.3, 100.0]" in text  # 64 of 64: Wilson low 64 / (64 + z^2) = 94.3%
  assert ("| paper: W8/S8 · 1 KV · seed 42 | lookup | prefix | 2.478 | 50.6 | 5.7 | 75.3 |"
          in text)
  assert "labelled paper (Qwen3-0.6B backbone, 100B tokens: a different scale)." in text
  assert "in_sequence | 2.478 | 27.6 | 3.4 | 44.0 |" in text
  assert published.run_for("full_1kv") is None and residue_tables.section([]) == ""
  # the sweep report shows the registry's residue tests as this table, other probes as JSON
  unit = types.SimpleNamespace(name="w8s8_1kv", probes={"lookup": record, "toy": {"x": 1}})
  lines = probe_tables.registry_table([unit])
  assert "\n".join(lines).startswith(text) and lines[-1] == '| w8s8_1kv | toy | `{"x": 1}` |'


def test_the_paper_protocol_sweep_config_enables_every_new_probe():
  from chunkformer.evaluation.sweep.config import settings_from
  from configs.sweeps import paper_protocol

  config = paper_protocol.get_config("w8s8_1kv,runs/my_run")
  settings = settings_from(config)  # the registry check a sweep runs before training
  paper_probes = {"lookup", "long_needle", "gate_concentration", "gate_cycling", "head_knockout"}
  assert paper_probes <= set(settings.probes) <= set(probe_registry.PROBES)
  assert set(settings.probes) - paper_probes == {"needle_sweep", "prefix_probe", "slot_gain"}
  assert config.variants.w8s8_1kv.config == "configs/paper/run.py:w8s8_1kv"
  assert config.variants.my_run.checkpoint == "runs/my_run"
  with pytest.raises(ValueError, match="name paper runs or run directories"):
    paper_protocol.get_config()


def test_the_matrices_store_target_positions_and_a_chunking_models_phase_in_its_chunk():
  # a hand-built "dynamic" model: chunks close at every value token, so the target key (a key
  # symbol, followed by its value) always starts a chunk unless filler precedes it in it
  retrieve = _retrieves_at(set(range(8)), 8)
  values = set(lookup_task.default_tokens(KV)["values"])

  def predict(rows):
    out = retrieve(rows)
    out["ends"] = np.isin(rows["inputs"], list(values))
    return out

  result = probe_registry.PROBES["lookup"](_context(predict), modulus=8, num_records=6,
                                           num_demos=2, paddings=("prefix",),
                                           positions="shift")
  matrix = result.matrices["prefix"]
  # shifted positions: residue r's positions are residue 0's plus r
  np.testing.assert_array_equal(matrix.positions_YxJ % 8, np.broadcast_to(np.arange(8),
                                                                           (64, 8)))
  np.testing.assert_array_equal(matrix.positions_YxJ - matrix.positions_YxJ[:, :1],
                                np.broadcast_to(np.arange(8), (64, 8)))
  # prefix padding: the records are one block after the filler, so the target key sits right
  # after a value (phase 0) or, as the block's first record, after the filler run
  assert matrix.phases_YxJ.shape == (64, 8) and (matrix.phases_YxJ >= 0).all()
  assert (matrix.phases_YxJ == 0).mean() > 0.5
  plain = probe_registry.PROBES["lookup"](_context(retrieve), modulus=8, num_records=6,
                                          num_demos=2, paddings=("prefix",))
  assert plain.matrices["prefix"].phases_YxJ is None  # a model without chunks of its own
  # what the model formed: a chunk per value (6 records + 2 demonstrations per row), the
  # target's chunk closed by its own value, right after the key
  formed = result.record["chunks"]["prefix"]
  assert formed["compression_ratio"] == pytest.approx(result.record["seq_len"] / 8)
  assert formed["target_chunk_length"] == pytest.approx(formed["target_phase"] + 2)
  assert formed["target_phase"] == pytest.approx(matrix.phases_YxJ.mean())
  assert plain.record["chunks"] is None


def test_plan_version_5_names_its_units_in_the_plans_order_with_its_probes():
  from chunkformer.evaluation.sweep.config import settings_from
  from configs.paper import runs
  from configs.sweeps import paper_protocol

  config = paper_protocol.plan5()
  settings = settings_from(config)  # the registry check a sweep runs before training
  order = list(settings.order)
  assert len(order) == 3 * (len(runs.RUNS) + len(runs.CURES)) + 2 * 2 * 2 == 98
  assert order[:3] == ["full_1kv_seed0", "full_4kv_seed0", "full_8kv_seed0"]
  block_a = 3 * len(paper_protocol.PLAN5_BLOCK_A)
  assert all(u.rsplit("_seed", 1)[0] in paper_protocol.PLAN5_BLOCK_A for u in order[:block_a])
  assert order[-1] == "size_large_full_1kv_seed1"
  assert settings.rules == "3" and settings.plan == "results/paper_plan5/PLAN.md"
  lookup_options = settings.probes["lookup"]
  assert lookup_options["positions"] == "shift" and lookup_options["num_demos"] == 14
  assert config.variants.cure_w4s2_1kv_seed2.overrides.data.lookup_demos == 14
  assert config.variants.size_small_w8s8_1kv_seed0.config == "configs/paper/run.py:w8s8_1kv,small"
  assert settings.probes["eviction_lookup"]["full_only"] is True
