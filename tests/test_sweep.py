"""Periodicity sweeps: construction invariants, bad input, results schema, resumption."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from chunkformer import config as config_lib
from chunkformer import data as data_lib
from chunkformer import heldout, trainer
from chunkformer import runtime as runtime_lib
from chunkformer.config import ConfigError, DataConfig
from chunkformer.data import code, kv
from chunkformer.evaluation.probes import (
  instruments,
  needle_sweep,
  prefix_probe,
  slot_gain,
  sown_boundaries,
)
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.records import correctness, results_file
from chunkformer.evaluation.records.variant import VariantRecord, VariantSetup
from chunkformer.evaluation.stats import periodicity as stats
from chunkformer.evaluation.stats import slot_null
from chunkformer.evaluation.stats.analysis_types import Interval
from chunkformer.evaluation.sweep import config as sweep_config
from chunkformer.evaluation.sweep import run as sweep
from chunkformer.evaluation.sweep import shards, unit
from chunkformer.studies.needles.claims import judgments
from configs import smoke
from configs.sweeps import sweep_config as make_sweep
from configs.sweeps import variant

KV = DataConfig(seq_len=96, num_pairs=6, key_len=2, value_len=2, num_queries=2,
                num_symbols=16, near_distance=30)
SPEC = needle_sweep.NeedleSweepSpec(num_offsets=12, num_haystacks=3, depths=(0.0, 0.5, 1.0),
                                    align=4, seed=5)
# A few training steps of configs/smoke.py, evaluated on a tiny sweep.
TINY = dict(name="tiny", num_offsets=12, num_haystacks=3, depths=(0.0, 1.0), prefix_prompts=2,
            prefix_max=8, slot_gain_rows=8, eval_batch_size=8, num_resamples=50,
            num_permutations=50)
# One query per row: the tiny sweep window (12 offsets) fits seq_len 32 beside one query block.
SMOKE = variant("configs/smoke.py", {"train.steps": 2, "train.checkpoint_every": 2,
                                     "data.num_queries": 1})


@pytest.mark.parametrize("depth_index", [0, 1, 2])
def test_sweep_rows_differ_only_in_the_moved_needle(depth_index):
  rows = needle_sweep.build(KV, SPEC)[depth_index]
  num_haystacks, num_offsets = rows.shape
  start, stop = needle_sweep.window(KV, SPEC, rows.depth)
  assert start % SPEC.align == 0
  np.testing.assert_array_equal(rows.offsets_J, np.arange(start, start + num_offsets))
  inputs = rows.rows["inputs"].reshape(num_haystacks, num_offsets, -1)
  targets = rows.rows["targets"].reshape(num_haystacks, num_offsets, -1)
  outside = np.ones(inputs.shape[-1], bool)
  outside[start:stop] = False
  for s in range(num_haystacks):
    # Outside the window every token, including the query block and the other needles, is equal.
    assert (inputs[s][:, outside] == inputs[s, :1][:, outside]).all()
    assert (targets[s, :, -4:] == targets[s, :1, -4:]).all()
    layout = rows.layouts[s * num_offsets]
    needle = np.array(layout.keys[0] + layout.values[0])
    for k, offset in enumerate(rows.offsets_J):
      window = inputs[s, k, start:stop]
      here = offset - start
      np.testing.assert_array_equal(window[here:here + needle.size], needle)
      others = np.delete(window, np.arange(here, here + needle.size))
      assert (others < kv.symbol_base(KV)).all(), "the window holds only the moved needle"
      n = s * num_offsets + k
      span = slice(rows.answer_start_N[n], rows.answer_stop_N[n])
      np.testing.assert_array_equal(targets[s, k, span], layout.values[0])


def test_depths_share_haystack_positions_mod_alignment_and_order_by_distance():
  far, middle, near = needle_sweep.build(KV, SPEC)
  assert far.distance_N.mean() > middle.distance_N.mean() > near.distance_N.mean()
  for rows in (middle, near):
    np.testing.assert_array_equal(rows.offsets_J % SPEC.align, far.offsets_J % SPEC.align)


def test_sweep_window_that_does_not_fit_names_num_offsets():
  spec = dataclasses.replace(SPEC, num_offsets=90)
  with pytest.raises(ConfigError, match="sweep.probes.needle_sweep.num_offsets"):
    needle_sweep.build(KV, spec)


@pytest.mark.parametrize("task", ["kv", "code"])
def test_prefix_probe_shifts_the_whole_prompt_by_n(task):
  config = KV if task == "kv" else DataConfig(task="code", seq_len=160, code_needles=2,
                                                near_distance=40)
  spec = prefix_probe.PrefixSpec(max_prefix=6, num_prompts=2, seed=1)
  probe = prefix_probe.build(config, spec)
  fill = kv.FILLER_BASE if task == "kv" else ord("=")
  pad = kv.PAD if task == "kv" else code.PAD
  k = probe.prefixes_J.size
  inputs = probe.rows["inputs"].reshape(2, k, -1)
  targets = probe.rows["targets"].reshape(2, k, -1)
  content = probe.base_len - 1  # base tokens after BOS
  for s in range(2):
    base = np.concatenate([inputs[s, 0], targets[s, 0, -1:]])
    for n in range(k):
      row = np.concatenate([inputs[s, n], targets[s, n, -1:]])
      assert row[0] == base[0]
      assert (row[1:1 + n] == fill).all()
      np.testing.assert_array_equal(row[1 + n:1 + n + content], base[1:1 + content])
      assert (row[1 + n + content:] == pad).all()
  # Every answer span holds the same tokens at every N.
  per_prompt = probe.answer_row_A.size // (2 * k)
  for a in range(probe.answer_row_A.size):
    prompt, rest = divmod(a, k * per_prompt)
    n, j = divmod(rest, per_prompt)
    ref = prompt * k * per_prompt + j
    np.testing.assert_array_equal(_answer(probe, a), _answer(probe, ref))
    assert probe.answer_start_A[a] == probe.answer_start_A[ref] + n


def _answer(probe, a):
  return probe.rows["targets"][probe.answer_row_A[a],
                               probe.answer_start_A[a]:probe.answer_stop_A[a]]


def test_prefix_longer_than_the_sequence_allows_names_prefix_max():
  with pytest.raises(ConfigError, match="sweep.probes.prefix_probe.max_prefix"):
    prefix_probe.base_config(KV, prefix_probe.PrefixSpec(max_prefix=60, num_prompts=2))


def test_chunk_phase_counts_from_the_last_closed_chunk():
  ends = np.zeros((3, 12), np.int8)
  ends[0, [2, 5, 9]] = 1
  ends[1, [7]] = 1
  phases = needle_sweep.chunk_phases(ends, np.array([4, 8, 3]))
  np.testing.assert_array_equal(phases, [1, 0, 3])
  assert needle_sweep.compression_ratio(ends) == pytest.approx(36 / 4)


def test_score_requires_every_answer_token():
  targets = np.array([[5, 6, 7, 8]])
  predictions = np.array([[5, 6, 0, 8]])
  exact, tokens = needle_sweep.score_answers(predictions, targets, np.array([0, 0]),
                                             np.array([0, 2]), np.array([2, 4]))
  np.testing.assert_array_equal(exact, [1.0, 0.0])
  np.testing.assert_array_equal(tokens, [1.0, 0.5])


def _sweep(variants, **settings):
  return make_sweep(variants, **dict(TINY, **settings))


@pytest.mark.parametrize("variants, settings, match", [
    ({"a": variant("configs/no_such_config.py")}, {}, "variants.a.config.*no config file"),
    ({"a": variant("configs/smoke.py", {"model.attention.chunk_sise": 4})}, {},
     "variants.a.overrides.model.attention.chunk_sise.*no field 'chunk_sise'"),
    ({"a": variant("configs/smoke.py", {"data.seq_len": "long"})}, {},
     "variants.a.overrides.data.seq_len"),
    ({"a": SMOKE}, {"num_offsets": 40}, "sweep.probes.needle_sweep.num_offsets"),
    ({"a": SMOKE}, {"num_offsets": 6, "reference_chunk_size": 4},
     "sweep.probes.needle_sweep.num_offsets.*>= 12"),
    ({"a": SMOKE}, {"order": ("a", "b")}, "sweep.order.*'b'"),
    ({"a": SMOKE}, {"order": ("(a,b)",)}, r"no variant '\(a,b\)'; on the command line a tuple "
     "needs quoted names"),
])
def test_bad_sweep_input_fails_before_anything_is_written(tmp_path, variants, settings, match):
  workdir = tmp_path / "sweep"
  workdir.mkdir()
  (workdir / "results.json").write_text("previous")
  with pytest.raises(ConfigError, match=match):
    sweep.run(_sweep(variants, **settings), str(workdir))
  assert sorted(os.listdir(workdir)) == ["results.json"]
  assert (workdir / "results.json").read_text() == "previous"


def test_checkpoint_variant_without_a_finished_run_is_refused(tmp_path):
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(ConfigError, match="holds no run"):
    sweep_config.resolve(_sweep({"a": variant(checkpoint=str(empty))}), str(tmp_path / "out"))


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("sweep") / "run")
  outcome = sweep.run(_sweep({"smoke": SMOKE}), workdir, command="test")
  return workdir, outcome


SCHEMA = {"name": str, "attention": str, "chunk_size": (int, type(None)), "rope": bool,
          "pooling": str, "overlap": bool, "stagger": bool, "key_shift": bool,
          "compression_ratio": float, "mean_accuracy": float, "max_gap": float,
          "periodic_share": float, "detected_period": (int, type(None)), "p_value": float,
          "offsets": list, "accuracy_by_offset": list, "accuracy_by_phase": list}


def test_results_json_has_the_schema_fields_and_types(finished_sweep):
  workdir, outcome = finished_sweep
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  (record,) = results["variants"]
  for key, kind in SCHEMA.items():
    assert isinstance(record[key], kind), (key, record[key])
  assert record["attention"] in ("full", "fixed", "dynamic")
  assert record["pooling"] in ("gated", "gated_no_bias", "mean", "mlp")
  assert len(record["offsets"]) == len(record["accuracy_by_offset"]) == TINY["num_offsets"]
  assert all(0.0 <= a <= 1.0 for a in record["accuracy_by_offset"])
  assert record["offsets"] == sorted(record["offsets"])
  assert [d["depth_name"] for d in record["depths"]] == ["far", "near"]
  assert len(record["prefix_probe"]["offsets"]) == TINY["prefix_max"] + 1
  assert results["verdicts"] == outcome.verdicts
  assert os.path.exists(outcome.report_path)
  with open(outcome.report_path) as f:
    text = f.read()
  assert "| smoke" in text and "## Verdicts" in text
  for path in record["images"].values():
    assert os.path.exists(os.path.join(workdir, path))
  # Full attention, 1-token needles: no slot gains (nor their init null), no split labels.
  assert record["slot_gain"] is None and "slot_gain_init" not in record
  assert "split_labels" not in record


def test_stored_correctness_matrices_recompute_the_reported_statistics(finished_sweep):
  workdir, _ = finished_sweep
  results = results_file.load(os.path.join(workdir, "results.json"))
  (record,) = results.variants
  assert record.identity() == {"variant": "smoke", "seed": 0, "key_len": 1, "value_len": 1,
                               "task": "kv"}
  matrices = correctness.load(correctness.path_for(workdir, "smoke"))
  assert sorted(matrices) == ["needle_far", "needle_near", "prefix"]
  far = matrices["needle_far"]
  assert far.correct_YxJ.shape == (TINY["num_haystacks"], TINY["num_offsets"])
  kw = dict(seed=results.seed, num_resamples=TINY["num_resamples"],
            num_permutations=TINY["num_permutations"])
  sizes = [t.chunk_size for t in record.analysis.by_chunk_size]
  # Every interval and test of the primary analysis, from the stored matrix alone.
  assert stats.analyze(far.correct_YxJ, far.offsets_J, sizes, **kw) == record.analysis
  overall = stats.bootstrap_mean_accuracy(far.correct_YxJ, num_resamples=kw["num_resamples"],
                                          seed=kw["seed"])
  assert (overall.mean, overall.low, overall.high) == (
      record.analysis.mean_accuracy.value, record.analysis.mean_accuracy.low,
      record.analysis.mean_accuracy.high)
  prefix = matrices["prefix"]
  assert stats.analyze(prefix.correct_YxJ, prefix.offsets_J, sizes,
                       **kw).nested() == record.prefix_probe.analysis
  pooled = np.concatenate([matrices["needle_far"].correct_YxJ,
                           matrices["needle_near"].correct_YxJ])
  assert stats.analyze(pooled, far.offsets_J, sizes, **kw).nested() == record.all_depths


def _comparable(path: str) -> dict:
  """results.json without what differs between invocations (dates, wall times, paths)."""
  with open(path) as f:
    results = json.load(f)
  for key in ("date", "wall_time_s", "command"):
    results.pop(key)
  for record in results["variants"]:
    for key in ("eval_wall_s", "train_wall_s", "workdir"):
      record.pop(key)
  return results


def test_two_shards_and_a_merge_give_the_unsharded_results(finished_sweep, tmp_path,
                                                          monkeypatch):
  workdir, _ = finished_sweep
  monkeypatch.setattr(trainer, "train", lambda *a, **k: pytest.fail("training started"))
  config = _sweep({"smoke": SMOKE, "smoke_b": SMOKE})  # two variants, one finished run each
  dirs = {}
  for name in ("whole", "sharded"):
    for variant_name in ("smoke", "smoke_b"):
      shutil.copytree(os.path.join(workdir, "smoke"), tmp_path / name / variant_name)
    dirs[name] = str(tmp_path / name)
  whole = sweep.run(config, dirs["whole"], command="test")
  part = sweep.run(config, dirs["sharded"], command="test", shard=shards.parse("1/2"))
  assert isinstance(part, sweep.PartOutcome)
  assert part.evaluated == ["smoke_b"] and part.missing == ["smoke"]
  again = sweep.run(config, dirs["sharded"], command="test", shard=shards.parse("1/2"))
  assert again.evaluated == [] and again.missing == ["smoke"]  # its record was reused
  assert not os.path.exists(os.path.join(dirs["sharded"], "results.json"))
  with pytest.raises(ConfigError, match=r"^--merge: .*smoke \(not evaluated\)"):
    sweep.merge(config, dirs["sharded"])
  last = sweep.run(config, dirs["sharded"], command="test", shard=shards.parse("0/2"))
  assert isinstance(last, sweep.Outcome)  # every part present: merged
  assert _comparable(last.results_path) == _comparable(whole.results_path)
  merged = sweep.merge(config, dirs["sharded"], command="test")
  assert _comparable(merged.results_path) == _comparable(whole.results_path)
  assert merged.table == whole.table and merged.verdicts == whole.verdicts
  # Records evaluated under other sweep settings are stale: the merge names them.
  with pytest.raises(ConfigError, match=r"smoke \(evaluated under other sweep settings: "
                     r"num_resamples\)"):
    sweep.merge(_sweep({"smoke": SMOKE, "smoke_b": SMOKE}, num_resamples=60), dirs["sharded"])


def test_rejudge_rewrites_the_judgments_from_results_json_alone(finished_sweep, tmp_path,
                                                                 monkeypatch):
  workdir, _ = finished_sweep
  copy = str(tmp_path / "copy")
  shutil.copytree(workdir, copy)
  with open(os.path.join(copy, "results.json")) as f:
    before = json.load(f)
  shutil.rmtree(os.path.join(copy, "smoke", "checkpoints"))  # as committed under results/
  monkeypatch.setattr(trainer, "train", lambda *a, **k: pytest.fail("training started"))
  monkeypatch.setattr(sweep, "_evaluate", lambda *a, **k: pytest.fail("evaluation started"))
  again = sweep.rejudge(_sweep({"smoke": SMOKE}), copy, command="rejudge-cmd")
  with open(again.results_path) as f:
    after = json.load(f)
  # Today's code wrote both: same judgments, and the run's own command, date and wall time.
  for key in ("verdicts", "claims", "variants", "command", "date", "wall_time_s"):
    assert after[key] == before[key], key
  with open(again.report_path) as f:
    assert "Judged again on " in f.read() and "rejudge-cmd" not in after["command"]
  with pytest.raises(ConfigError, match=r"^--rejudge: .* no record of smoke_b"):
    sweep.rejudge(_sweep({"smoke": SMOKE, "smoke_b": SMOKE}), copy)


def test_a_finished_variant_is_not_retrained(finished_sweep, monkeypatch):
  workdir, first = finished_sweep
  def refuse(*args, **kwargs):
    raise AssertionError("trainer.train called for a finished variant")
  monkeypatch.setattr(trainer, "train", refuse)
  again = sweep.run(_sweep({"smoke": SMOKE}), workdir, command="test")  # the fixture's command
  assert again.records[0].analysis == first.records[0].analysis


def test_a_variant_with_a_current_record_is_not_evaluated_again(finished_sweep, tmp_path,
                                                                monkeypatch):
  workdir, first = finished_sweep
  copy = str(tmp_path / "copy")
  shutil.copytree(workdir, copy)
  monkeypatch.setattr(trainer, "train", lambda *a, **k: pytest.fail("training started"))
  # the stored record is current: nothing to evaluate
  monkeypatch.setattr(sweep.unit, "evaluate", lambda *a, **k: pytest.fail("evaluation started"))
  again = sweep.run(_sweep({"smoke": SMOKE}), copy, command="test")
  assert again.records[0].analysis == first.records[0].analysis
  assert again.verdicts == first.verdicts
  # As committed under results/ (no records/, no checkpoints): results.json's entry serves.
  shutil.rmtree(os.path.join(copy, sweep.RECORDS_DIR))
  shutil.rmtree(os.path.join(copy, "smoke", "checkpoints"))
  again = sweep.run(_sweep({"smoke": SMOKE}), copy, command="test")
  assert again.records[0].analysis == first.records[0].analysis
  assert sweep.merge(_sweep({"smoke": SMOKE}), copy).verdicts == first.verdicts
  # A record made under other sweep settings is stale: that variant is evaluated again.
  asked = []

  def evaluate(trained, variant, *args, **kwargs):
    asked.append(variant.name)
    raise InterruptedError("stop here")
  monkeypatch.setattr(sweep.trained_lib, "load", lambda workdir_: None)
  monkeypatch.setattr(sweep.unit, "evaluate", evaluate)
  with pytest.raises(InterruptedError, match="stop here"):
    sweep.run(_sweep({"smoke": SMOKE}, num_resamples=60), copy, command="test")
  assert asked == ["smoke"]


def test_each_unit_is_evaluated_once_it_trains_so_a_stopped_sweep_keeps_its_records(
    tmp_path, monkeypatch):
  real = trainer.train

  def train(config, workdir, **kwargs):
    if os.path.basename(workdir) == "second":
      raise InterruptedError("stopped before the second unit trained")
    return real(config, workdir, **kwargs)
  monkeypatch.setattr(trainer, "train", train)
  workdir = str(tmp_path / "run")
  with pytest.raises(InterruptedError):
    sweep.run(_sweep({"first": SMOKE, "second": SMOKE}), workdir, command="test")
  assert os.path.exists(sweep.record_path(workdir, "first"))  # trained, then evaluated
  assert not os.path.exists(sweep.record_path(workdir, "second"))


def test_unfinished_checkpoint_dir_is_refused(finished_sweep, tmp_path):
  workdir, _ = finished_sweep
  copy = tmp_path / "unfinished"
  shutil.copytree(os.path.join(workdir, "smoke"), copy)
  with open(copy / "config.json") as f:
    recorded = json.load(f)
  recorded["train"]["steps"] = 10
  with open(copy / "config.json", "w") as f:
    json.dump(recorded, f)
  with pytest.raises(ConfigError, match="unfinished run.*step 2 of 10"):
    sweep_config.resolve(_sweep({"a": variant(checkpoint=str(copy))}), str(tmp_path / "out"))


def test_variant_recorded_before_a_config_field_existed_is_still_finished(finished_sweep,
                                                                         tmp_path):
  workdir, _ = finished_sweep
  copy = tmp_path / "older"
  shutil.copytree(workdir, copy)
  with open(copy / "smoke" / "config.json") as f:
    recorded = json.load(f)
  del recorded["model"]["attention"]["interpret"]  # stands for a field added since, at default
  with open(copy / "smoke" / "config.json", "w") as f:
    json.dump(recorded, f)
  resolved = sweep_config.resolve(_sweep({"smoke": SMOKE}), str(copy))
  assert sweep.is_finished(resolved.variants[0])


def test_variant_dir_holding_another_config_is_refused_before_training(finished_sweep):
  workdir, _ = finished_sweep
  other = variant("configs/smoke.py", {"train.steps": 3})
  with pytest.raises(ConfigError, match="(?s)'smoke'.*different config.*train.steps"):
    sweep.run(_sweep({"smoke": other}), workdir)


def _record(name, attention="fixed", m=4, p=0.001, period=4, gap=0.5, far=0.6, **setup):
  """A record with these numbers (the rest from a constant matrix); ``setup`` as VariantSetup."""
  base = stats.analyze(np.ones((2, 12)), np.arange(12), [4], num_resamples=10,
                       num_permutations=10)
  gap = Interval(*gap) if isinstance(gap, tuple) else Interval(gap, None, None)
  phase = dataclasses.replace(base.phase, gap=gap, p_value=p)
  analysis = dataclasses.replace(
      base, phase=phase, detected_period=period, mean_accuracy=Interval(far, None, None),
      by_chunk_size=(dataclasses.replace(base.by_chunk_size[0], table=phase, p_value=p),))
  return VariantRecord(VariantSetup(name, attention, attention, chunk_size=m, **setup),
                       analysis, "needle", 10, compression_ratio=None)


def test_verdicts_follow_the_numbers():
  lines = judgments.decide([
      _record("full", attention="full", m=None, p=0.6, period=None, gap=0.02, far=0.99),
      _record("m2", m=2, period=2, gap=(0.2, 0.1, 0.3)),
      _record("m4", gap=(0.5, 0.4, 0.6)),
      _record("m8", m=8, period=4, p=0.2),
      _record("norope", rope=False, p=0.3, period=None),
      _record("dyn", attention="dynamic", p=0.5, period=None, gap=0.05, far=0.8),
  ])

  def said(prefix):
    return any(line.startswith(prefix) for line in lines)

  assert said("REPRODUCED: period = M for fixed M=4 ")
  assert said("NOT REPRODUCED: period = M for fixed M=8 ")
  assert said("REPRODUCED: full attention has no period")
  assert said("NOT REPRODUCED on one seed: still periodic with RoPE off")
  assert said("INCONCLUSIVE (no data): still periodic with uniform pooling")
  assert not said("NOT TESTED")
  assert said("REPRODUCED: gap(M=2) < gap(M=4)")
  # Overlapping gap intervals: the order alone is not a finding.
  overlap = judgments.decide([_record("m2", m=2, period=2, gap=(0.2, 0.1, 0.45)),
                             _record("m4", gap=(0.5, 0.4, 0.6))])
  assert any(line.startswith("INCONCLUSIVE (the predicted order, intervals overlap): gap(M=2)")
             for line in overlap)
  assert any(line.startswith("CURE: dyn") and "removes the periodic blind spot at no accuracy "
             "cost" in line for line in lines)


def test_cure_verdict_against_an_unlearned_baseline_is_inconclusive():
  lines = judgments.decide([
      _record("m4", far=0.1, gap=0.1),
      _record("dyn", attention="dynamic", p=0.5, period=None, gap=0.02, far=0.15),
  ])
  assert any(line.startswith("REPRODUCED: period = M for fixed M=4 ") and "barely learned" in line
             for line in lines)
  cure = next(line for line in lines if line.startswith("CURE: dyn"))
  assert "inconclusive" in cure and "removes" not in cure


def _untrained(**overrides) -> trained_lib.TrainedModel:
  """configs/smoke.py with dotted overrides, randomly initialised (construction tests)."""
  raw = sweep_config.apply_overrides(smoke.get_config(), overrides, "test")
  config = config_lib.from_dict(raw.to_dict())
  rt = runtime_lib.build(config)
  return trained_lib.TrainedModel("-", config, rt, rt.init_state().params, 0)


def test_slot_bias_preference_is_its_weight_centre_of_mass():
  ape = np.zeros((4, 2, 6))
  ape[3, 0] = 5.0  # head 0 favours the last slot; head 1 is flat
  weights = slot_gain.bias_weights(ape, overlap=False)
  np.testing.assert_allclose(weights.sum(axis=1), 1.0)
  np.testing.assert_allclose(weights[1], 0.25)
  phases = slot_null.preferred_phase(weights)
  assert phases[0] > 2.9 and phases[1] == pytest.approx(1.5)
  # Overlap: the first channel half pools chunk i-1 (slots 0..3), the second chunk i (4..7).
  ape = np.zeros((4, 1, 4))
  ape[0, 0, 2:] = 5.0
  assert np.argmax(slot_gain.bias_weights(ape, overlap=True)[0]) == 4


def test_realised_pooling_weights_of_a_fixed_model_are_distributions_over_slots():
  trained = _untrained(**{"model.attention.kind": "fixed", "model.attention.window": 4,
                          "model.attention.chunk_size": 4})
  rows = data_lib.make_batch(trained.config.data, seed=0, step=0, split="heldout")
  out = instruments.predictor(trained, 8)(rows)
  sums = {k: v.sum(axis=0) for k, v in out.items() if k.startswith("pool_")}
  sites = slot_gain.analyze(trained.params, trained.config.model, sums)["sites"]
  assert [s["layer"] for s in sites] == [0, 1]
  for site in sites:
    assert site["slots"] == 4 and site["num_chunks"] == 8 * (32 // 4)
    np.testing.assert_allclose(np.sum(site["realised_weight"], axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(site["bias_weight"], 0.25)  # zero-initialised slot bias
  # C6's null reads the parameters the trainer starts from (same config and seed).
  jax.tree.map(np.testing.assert_array_equal, slot_gain.init_params(trained), trained.params)


def test_dynamic_phases_use_the_boundaries_the_model_used():
  trained = _untrained(**{"model.attention.kind": "dynamic", "model.attention.window": 4,
                          "model.attention.boundary": "router", "model.attention.chunk_size": 4})
  model = trained.config.model

  def extract(collections, rows):
    ends = sown_boundaries.end_flags(model, collections["intermediates"])
    (sown,) = jax.tree.leaves(collections["aux_metrics"])  # the model's own mean chunk length
    return {"ends": ends, "sown": jnp.broadcast_to(sown, ends.shape[:1])}

  rows = data_lib.make_batch(trained.config.data, seed=0, step=0, split="heldout")
  out = trained_lib.Predictor(trained, 8, extract=extract)(rows)
  assert 0 < out["ends"].sum() < out["ends"].size
  assert needle_sweep.compression_ratio(out["ends"]) == pytest.approx(out["sown"][0], rel=1e-5)


def test_sweep_whose_workdir_is_a_file_fails_before_training(tmp_path, monkeypatch):
  path = tmp_path / "taken"
  path.write_text("not a directory")
  monkeypatch.setattr(trainer, "train", lambda *a, **k: pytest.fail("training started"))
  with pytest.raises(ConfigError, match="--workdir '.*taken' is a file, not a directory"):
    sweep.run(_sweep({"a": SMOKE}), str(path))
  with pytest.raises(ConfigError, match="lies under the file"):
    sweep.run(_sweep({"a": SMOKE}), str(path / "sub"))
  assert path.read_text() == "not a directory"


def test_window_alignment_that_does_not_fit_names_the_chunk_sizes_not_num_offsets(tmp_path):
  fixed = lambda m: variant("configs/smoke.py", {
      "data.seq_len": 96, "model.attention.kind": "fixed", "model.attention.chunk_size": m})
  # lcm(4, 5, 7) = 140 > 96: no window start is a multiple of it, whatever num_offsets says.
  with pytest.raises(ConfigError) as raised:
    sweep_config.resolve(_sweep({"m5": fixed(5), "m7": fixed(7)}, num_offsets=24,
                                reference_chunk_size=4), str(tmp_path / "out"))
  message = str(raised.value)
  assert "\n" not in message and "least common multiple" in message
  assert "M=5 (m5)" in message and "M=7 (m7)" in message and "num_offsets" not in message


def test_eval_on_a_sweep_directory_names_the_commands_it_wants(tmp_path):
  variant_dir = tmp_path / "smoke"
  variant_dir.mkdir()
  (variant_dir / "config.json").write_text("{}")
  command = "python eval.py --config configs/sweeps/demo.py --workdir runs/demo"
  (tmp_path / "results.json").write_text(json.dumps({"command": command}))
  with pytest.raises(ConfigError) as raised:
    heldout.evaluate_checkpoint(str(tmp_path))
  message = str(raised.value)
  assert "holds a sweep (runs smoke), not one run" in message and "\n" not in message
  assert f"python eval.py --workdir {variant_dir}" in message
  assert f"`{command}`" in message  # the command recorded in its results.json


def test_fixed_multi_token_record_carries_split_labels_and_init_slot_gains(tmp_path):
  # An untrained fixed M=4 model with 2-token keys and values, evaluated as a sweep variant.
  overrides = {"model.attention.kind": "fixed", "model.attention.window": 4,
               "model.attention.chunk_size": 4, "data.key_len": 2, "data.value_len": 2,
               "data.num_pairs": 2, "data.num_queries": 1, "data.seq_len": 64}
  sweep = sweep_config.resolve(_sweep({"fx": variant("configs/smoke.py", overrides)},
                                      prefix_prompts=0), str(tmp_path))
  (fx,) = sweep.variants
  model = _untrained(**overrides)
  record = unit.evaluate(model, fx, sweep, str(tmp_path))
  labels = record.split_labels
  assert labels["kind_by_phase"] == {"0": "none", "1": "value_cut", "2": "total", "3": "key_cut"}
  assert sum(v["trials"] for v in labels["by_label"].values()) == 3 * 12  # haystacks x offsets
  assert labels["mean_accuracy"] == pytest.approx(record.far_accuracy)
  # The model is its own initialisation here: the null's gains equal the trained ones.
  assert [s.site for s in record.slot_gain_init] == [s.site for s in record.slot_gain]
  for init, trained in zip(record.slot_gain_init, record.slot_gain, strict=True):
    np.testing.assert_allclose(init.realised_weight, trained.realised_weight, rtol=1e-6)
  assert VariantRecord.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_a_sweep_finds_its_variant_configs_from_any_working_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # notebooks run from notebooks/, scripts from anywhere
  config = sweep_config.load_config_file("configs/kv_chunk.py", "variants.x.config")
  assert config.model.attention.kind == "fixed"
