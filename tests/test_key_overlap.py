"""The key overlap probe: shared key suffixes and prefixes, the scoring of queries, and the
script on a trained run."""

import json
import os
import subprocess
import sys

import pytest

from chunkformer import config as config_lib
from chunkformer import trainer
from chunkformer.config_sections.data import DataConfig
from chunkformer.data import kv
from chunkformer.studies.needles.probes import key_overlap
from configs import smoke

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIG = DataConfig(seq_len=96, num_pairs=6, num_queries=4, key_len=2, value_len=2,
                    num_symbols=4)  # 4 symbols: many keys share a token


def test_shared_suffix_and_prefix_are_the_longest_over_the_other_keys():
  key, others = (5, 6, 7), [(1, 6, 7), (5, 9, 9), (7, 7, 7)]
  assert key_overlap.shared_suffix(key, others) == 2  # (1, 6, 7)
  assert key_overlap.shared_prefix(key, others) == 1  # (5, 9, 9)
  assert key_overlap.shared_suffix(key, [(7, 6, 5)]) == 0  # a reversed key shares no end
  assert key_overlap.shared_suffix(key, []) == key_overlap.shared_prefix(key, []) == 0


def test_score_reads_each_answer_token_and_classifies_by_the_rows_keys():
  layouts = key_overlap.sample(CONFIG, 8, seed=0)
  targets = kv.render_many(layouts, CONFIG)["targets"]
  predictions = targets.copy()
  first = kv.query_spans(layouts[0])[0]
  predictions[0, first.answer_start + 1] += 1  # the first query's second value token wrong
  outcomes = key_overlap.score(layouts, targets, predictions)
  assert len(outcomes) == 8 * CONFIG.num_queries
  assert outcomes[0].right == (True, False) and not outcomes[0].correct
  assert all(o.correct for o in outcomes[1:])
  asked = layouts[0].keys[first.pair]
  others = [k for i, k in enumerate(layouts[0].keys) if i != first.pair]
  expected_suffix = 1 if any(k[-1] == asked[-1] for k in others) else 0
  assert outcomes[0].suffix == expected_suffix
  assert outcomes[0].prefix == (1 if any(k[0] == asked[0] for k in others) else 0)


def test_by_overlap_counts_every_query_once_with_per_token_accuracy():
  outcomes = [key_overlap.Outcome(0, 0, (True, True)), key_overlap.Outcome(0, 1, (True, False)),
              key_overlap.Outcome(1, 0, (False, False))]
  suffix = key_overlap.by_overlap(outcomes, key_len=2, side="suffix")
  assert [(r.shared, r.queries, r.needle_accuracy) for r in suffix] == [(0, 2, 0.5),
                                                                        (1, 1, 0.0)]
  assert suffix[0].token_accuracy == (1.0, 0.5)
  prefix = key_overlap.by_overlap(outcomes, key_len=3, side="prefix")
  assert [r.queries for r in prefix] == [2, 1, 0] and prefix[2].needle_accuracy is None
  with pytest.raises(ValueError, match="side"):
    key_overlap.by_overlap(outcomes, key_len=2, side="middle")


def _script(*args):
  return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "key_overlap.py"), *args],
                        cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
                        text=True, timeout=300)


def test_script_scores_every_query_of_a_trained_run_and_keeps_its_output(tmp_path):
  c = smoke.get_config()
  c.train.steps = 2
  c.data.key_len = 2
  config = config_lib.from_dict(c.to_dict())
  run = str(tmp_path / "run")
  trainer.train(config, run)
  out = str(tmp_path / "overlap")
  done = _script("--out", out, "--rows", "8", "--batch_size", "4", run)
  assert done.returncode == 0, done.stderr
  result = json.load(open(out + ".json"))
  (scored,) = result["runs"]
  assert scored["step"] == 2 and scored["key_len"] == 2
  for side in ("suffix", "prefix"):  # every query counted once, on either side
    assert [r["shared"] for r in scored[side]] == [0, 1]
    assert sum(r["queries"] for r in scored[side]) == 8 * config.data.num_queries
  assert "| run | key tokens | key shift | suffix 0 | suffix 1 |" in open(out + ".md").read()
  again = _script("--out", out, "--rows", "8", run)  # written results are never replaced
  assert again.returncode != 0 and "--overwrite" in again.stderr
