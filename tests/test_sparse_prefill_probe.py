"""The ``sparse_needles`` probe: predictions through prefill(sparse=...) + decoding; keep-all
answers as the plain needle sweep does, a sparse pattern changes what the prompt reads, and
the record's accuracies by offset and phase are its matrix's."""

import numpy as np
import pytest

from chunkformer import sparse_prefill
from chunkformer.config import ConfigError
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.probes.base import ProbeContext
from chunkformer.evaluation.probes.registry import PROBES, check
from chunkformer.studies.sparse_prefill.probes import sparse_needles
from tests import policy_sweeps


@pytest.fixture(scope="module")
def trained():
  return policy_sweeps.smoke_model()  # 2 full layers, T = 32


def _rows(trained):
  return policy_sweeps.far_rows(trained, 8)


def _predict(trained, pattern, block=4, prompt_end="answer"):
  rows = _rows(trained)
  plan = sparse_prefill.Plan.uniform(trained.config.model, pattern, block=block)
  predictor = sparse_needles.SparsePrefillPredictor(
      trained, 16, plan, sparse_needles.prompt_length(rows, prompt_end))
  return rows, predictor, predictor(rows.rows)["predictions"]


def test_the_prompt_ends_after_or_before_the_token_that_predicts_the_first_answer_token(trained):
  rows = _rows(trained)
  start = int(rows.answer_start_N[0])  # predictions[start] is the first answer token
  assert sparse_needles.prompt_length(rows, "answer") == start + 1  # from the prefill
  assert sparse_needles.prompt_length(rows, "question") == start  # decoded after it


@pytest.mark.parametrize("prompt_end", ["answer", "question"])
def test_keep_all_prefill_answers_as_the_plain_needle_sweep(trained, prompt_end):
  rows, predictor, got = _predict(trained, sparse_prefill.KeepAll(), prompt_end=prompt_end)
  dense = trained_lib.Predictor(trained, 16)(rows.rows)["predictions"]  # the forward pass
  for i, (start, stop) in enumerate(zip(rows.answer_start_N, rows.answer_stop_N, strict=True)):
    # the answer's tokens (answer: the first from the prefill, the rest decoded step by step)
    np.testing.assert_array_equal(got[i, start:stop], dense[i, start:stop])
  assert predictor.kept_fraction(rows.rows["inputs"][:4]) == pytest.approx(1.0)


def test_a_sparse_prefill_keeps_less_and_changes_what_the_prompt_reads(trained):
  rows, predictor, got = _predict(trained, sparse_prefill.AShape(sink=0, local=4))
  _, _, dense = _predict(trained, sparse_prefill.KeepAll())
  assert predictor.kept_fraction(rows.rows["inputs"][:4]) < 0.5
  prompt = sparse_needles.prompt_length(rows)
  assert (got[:, :prompt] != dense[:, :prompt]).any()
  # with the whole query prefilled, the first answer token is the sparse prefill's own
  start = rows.answer_start_N[0]
  assert prompt == start + 1 and (got[:, start] != dense[:, start]).any()


def test_probe_records_accuracy_by_offset_and_phase_for_each_pattern(trained):
  patterns = [dict(pattern="keep_all", block=4), dict(pattern="block_sparse", block=4, top=2)]
  options = dict(patterns=patterns, num_offsets=8, num_haystacks=2, batch_size=16,
                 phase_sizes=(8,))
  check({"sparse_needles": options})
  context = ProbeContext(trained, None, "unit", (3,))
  result = PROBES["sparse_needles"](context, **options)
  assert list(result.record) == ["keep_all-b4", "block_sparse-k2-b4"]
  record = result.record["block_sparse-k2-b4"]
  assert record["pattern"] == patterns[1] and record["block"] == 4
  assert record["prompt_end"] == "answer"
  assert record["prompt_tokens"] == [int(_rows(trained).answer_start_N[0]) + 1]
  assert 0 < record["kept_fraction"] < 1
  matrix = result.matrices["block_sparse-k2-b4_far"]
  assert matrix.correct_YxJ.shape == (2, 8)
  far = record["depths"]["far"]
  assert far["matrix"] == "block_sparse-k2-b4_far"  # the key the claims read
  np.testing.assert_allclose(far["accuracy_by_offset"], matrix.correct_YxJ.mean(axis=0))
  for size in (3, 4, 8):  # the unit's chunk size, the pattern's block and the option's
    phase = matrix.offsets_J % size
    expected = [matrix.correct_YxJ[:, phase == p].mean() if (phase == p).any() else None
                for p in range(size)]
    assert far["accuracy_by_phase"][str(size)] == pytest.approx(expected)
  with pytest.raises(ConfigError, match=r"'sweep.probes.sparse_needles.patterns\[0\].block'"):
    check({"sparse_needles": dict(patterns=[dict(pattern="keep_all")])})
  with pytest.raises(ConfigError, match=r"patterns\[0\].pattern"):
    check({"sparse_needles": dict(patterns=[dict(pattern="nope", block=4)])})
  with pytest.raises(ConfigError, match="listed twice"):
    check({"sparse_needles": dict(patterns=patterns * 2)})
