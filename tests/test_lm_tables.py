"""The language models' loss-by-position tables (``lm_tables``) and the stored per-token rows
(``loss_rows.Rows``), on synthetic losses with a planted period-4 pattern."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from chunkformer.evaluation.records import loss_rows
from chunkformer.evaluation.records.variant import VariantRecord, VariantSetup
from chunkformer.evaluation.report.sections import View
from chunkformer.evaluation.stats import loss_phase, seed_rule
from chunkformer.evaluation.stats import periodicity as stats
from chunkformer.studies.lm.claims import loss_signatures
from chunkformer.studies.lm.report import loss_tables

M = 4
N, T = 32, 64
PLANTED = 0.08  # nats added at phase 3 (column mod 4) by the "fixed" model
RESAMPLING = dict(seed=0, num_resamples=200, num_permutations=400)


def _rows(seed: int, planted: float, noise_seed: int) -> loss_rows.Rows:
  """Row-falling loss + noise (+ ``planted`` at phase 3); the mask depends on the seed only,
  as held-out rows do (every model of a seed reads the same rows)."""
  mask = (np.random.default_rng(seed).random((N, T)) > 0.05).astype(np.float64)
  t = np.arange(T)
  noise = np.random.default_rng(noise_seed).normal(0.0, 0.3, (N, T))
  loss = 2.0 + 3.0 / np.sqrt(1.0 + t) + planted * (t % M == 3) + noise
  loss = np.where(mask > 0, np.abs(loss), 0.0).astype(np.float32)
  return loss_rows.Rows(loss, mask, np.ones((N, T)))


def _record(variant: str, attention: str, seed: int, rows: loss_rows.Rows) -> VariantRecord:
  setup = VariantSetup(variant, attention, attention, chunk_size=M, seed=seed, task="corpus",
                       name=f"{variant}_seed{seed}")
  analysis = stats.analyze(np.ones((4, 8)), np.arange(8), [M], num_resamples=10,
                           num_permutations=10)
  return VariantRecord(setup, analysis, "prefix", 10, compression_ratio=1.0,
                       lm_phase_loss={"signature": rows.signature(M, **RESAMPLING)})


@pytest.fixture(scope="module")
def units():
  rows, records = {}, []
  for seed in range(3):
    for variant, attention, planted in (("full", "full", 0.0), ("fixed_m4", "fixed", PLANTED)):
      r = _rows(seed, planted, noise_seed=10 * seed + len(variant))
      records.append(_record(variant, attention, seed, r))
      rows[records[-1].name] = r
  return records, rows


def test_rows_round_trip_through_the_stored_file(tmp_path, units):
  _, rows = units
  path = loss_rows.save(loss_rows.path_for(str(tmp_path), "fixed_m4_seed0"),
                            rows["fixed_m4_seed0"])
  loaded = loss_rows.loader(str(tmp_path))("fixed_m4_seed0")
  for name in ("loss_NxT", "mask_NxT", "bytes_NxT"):
    np.testing.assert_array_equal(getattr(loaded, name), getattr(rows["fixed_m4_seed0"], name))
  # The signature recomputes exactly from the stored rows.
  assert loaded.signature(M, **RESAMPLING) == rows["fixed_m4_seed0"].signature(M, **RESAMPLING)
  assert loss_rows.loader(str(tmp_path))("absent") is None
  with pytest.raises(ValueError, match="0/1"):
    loss_rows.save(path, loss_rows.Rows(np.zeros((1, 4)), np.full((1, 4), 0.5),
                                                np.ones((1, 4))))


def test_stacking_seeds_gives_the_signature_of_all_rows(units):
  _, rows = units
  both = loss_rows.stack([rows["full_seed0"], rows["full_seed1"]])
  assert both.loss_NxT.shape == (2 * N, T)
  np.testing.assert_array_equal(both.mask_NxT[N:], rows["full_seed1"].mask_NxT)


def test_pooled_signature_finds_the_planted_period_and_not_in_the_control(units):
  records, rows = units
  pooled = loss_signatures.pooled_signatures(records, rows.get, **RESAMPLING)
  fixed, full = pooled["fixed_m4"], pooled["full"]
  assert fixed["control"] == "full" and full["versus_control"] is None
  # Planted +0.08 at phase 3: excess +0.06 there, -0.02 elsewhere (zero-mean over phases).
  np.testing.assert_allclose(fixed["signature"]["excess_by_phase"], [-0.02, -0.02, -0.02, 0.06],
                             atol=0.012)
  assert fixed["signature"]["p_value"] < 0.01
  assert fixed["agreement"].verdict == seed_rule.REPRODUCED
  assert fixed["agreement"].count == "3/3"
  assert full["agreement"].verdict == seed_rule.NOT_REPRODUCED
  # Paired against full attention on the same rows: amplitude difference near 0.08, above 0.
  diff = fixed["versus_control"]["amplitude"]
  assert diff["difference_low"] > 0 and diff["difference"] == pytest.approx(PLANTED, abs=0.03)
  a = loss_rows.stack([rows[f"fixed_m4_seed{s}"] for s in range(3)])
  b = loss_rows.stack([rows[f"full_seed{s}"] for s in range(3)])
  assert diff == loss_phase.amplitude_difference(a.loss_NxT, b.loss_NxT, b.mask_NxT, M, seed=0,
                                                 num_resamples=200)
  # Bits per byte, paired: (sum of loss differences) / ln 2 / bytes, inside its interval.
  bpb = fixed["versus_control"]["bits_per_byte"]
  expected = (a.loss_NxT.astype(np.float64) - b.loss_NxT).sum() / a.mask_NxT.sum() / np.log(2)
  assert bpb["difference"] == pytest.approx(expected)
  assert bpb["difference_low"] < expected < bpb["difference_high"]


def test_paired_bits_per_byte_difference_by_hand():
  loss_a = np.array([[1.0, 2.0], [3.0, 5.0]])
  loss_b = np.array([[1.0, 1.0], [1.0, 1.0]])
  mask = np.array([[1.0, 1.0], [1.0, 0.0]])
  # Differences on scored targets: 0 + 1 + 2 = 3 nats over 3 bytes (the masked 4 ignored).
  out = loss_phase.bits_per_byte_difference(loss_a, loss_b, mask, num_resamples=50)
  assert out["difference"] == pytest.approx(1.0 / np.log(2))
  # Two bytes per target halves it.
  two = loss_phase.bits_per_byte_difference(loss_a, loss_b, mask, np.full((2, 2), 2.0),
                                            num_resamples=50)
  assert two["difference"] == pytest.approx(0.5 / np.log(2))
  same = loss_phase.bits_per_byte_difference(loss_a, loss_a, mask, num_resamples=50)
  assert same == {"difference": 0.0, "difference_low": 0.0, "difference_high": 0.0}


def test_rows_of_other_held_out_sequences_are_not_paired(units):
  records, rows = units
  shifted = dict(rows)
  shifted["full_seed0"] = _rows(99, 0.0, noise_seed=1)  # another mask: other rows
  pooled = loss_signatures.pooled_signatures(records, shifted.get, **RESAMPLING)
  assert pooled["fixed_m4"]["versus_control"] is None


def test_tables_and_figure(units, tmp_path):
  records, rows = units
  judged = loss_signatures.Tables(
      loss_signatures.code_accuracies(records),
      loss_signatures.pooled_signatures(records, rows.get, **RESAMPLING))
  text = loss_tables.sections(View(records, (), judged, str(tmp_path / "plots"), str(tmp_path)))
  assert "## Loss by position mod 4 (language models, per unit)" in text
  assert "| fixed_m4_seed2 |" in text and "| full_seed0 |" in text
  fixed_row = next(line for line in text.splitlines() if line.startswith("| fixed_m4 |"))
  assert "| 3/3 | present |" in fixed_row
  full_row = next(line for line in text.splitlines() if line.startswith("| full |"))
  assert "| 0/3 | absent |" in full_row
  assert "![loss by position mod M, seeds pooled](plots/lm_loss_by_phase.png)" in text
  assert (tmp_path / "plots" / "lm_loss_by_phase.png").stat().st_size > 0
  # Without language-model records, nothing.
  plain = [dataclasses.replace(r, lm_phase_loss=None) for r in records]
  nothing = loss_signatures.Tables({}, {})
  assert loss_tables.sections(View(plain, (), nothing, str(tmp_path), str(tmp_path))) == ""
