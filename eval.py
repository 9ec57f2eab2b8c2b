"""Evaluates trained runs.

  python eval.py --workdir DIR [--eval_batches N]
      held-out metrics (loss, accuracy, near/far accuracy) of the newest checkpoint in DIR,
      using the config recorded there, as JSON on stdout;
  python eval.py --config configs/sweeps/<name>.py --workdir DIR [--config.sweep.x=v]
      a periodicity sweep: trains the variants without a finished run in DIR/<variant>/
      (resumable), evaluates all, writes DIR/results.json, DIR/report.md and DIR/plots/, and
      ends by printing the comparison table and the path of report.md;
  python eval.py --config ... --workdir DIR --shard i/n
      only the variants of shard i of n (0 <= i < n; positions i, i + n, ... of sweep.order),
      each part resumable; the part that finds every variant evaluated writes the results;
  python eval.py --config ... --workdir DIR --merge
      results.json, report.md and plots/ from the stored records of every variant;
  python eval.py --config ... --workdir DIR --rejudge
      the same from DIR/results.json's records, judged again by the current verdict and claim
      code (a finished sweep whose training directories are gone, e.g. results/).
"""

import json
import shlex
import sys

from absl import app, flags

from chunkformer import cli, run_lock, studies
from chunkformer import heldout as heldout_lib
from chunkformer.config import ConfigError
from chunkformer.evaluation.records.reading import UnreadableFile
from chunkformer.evaluation.sweep import config as sweep_config
from chunkformer.evaluation.sweep import run as sweep
from chunkformer.evaluation.sweep import shards

_CONFIG = cli.define_config_flag(required=False)
_WORKDIR = cli.define_workdir_flag()
_EVAL_BATCHES = flags.DEFINE_integer("eval_batches", None,
                                     "held-out batches (default: the run's train.eval_batches)")
_ALLOW_UNFINISHED = flags.DEFINE_bool("allow_unfinished", False,
                                      "evaluate the newest checkpoint of an unfinished run")
_SHARD = flags.DEFINE_string("shard", None, "i/n: run only shard i of n of a sweep's variants")
_MERGE = flags.DEFINE_bool("merge", False, "merge the sweep's stored per-variant records")
_REJUDGE = flags.DEFINE_bool("rejudge", False, "judge a finished sweep again from DIR/results.json "
                             "(verdicts, claims, report; nothing retrained)")
cli.define_distributed_flags()


def _run_sweep(config) -> None:
  if not sweep_config.is_sweep_config(config):
    raise ConfigError("config field 'sweep' is missing: --config must be a sweep config "
                      "(configs/sweeps/*.py); train configs go to train.py")
  command = shlex.join(["python"] + sys.argv)
  if sum([_MERGE.value, _REJUDGE.value, _SHARD.value is not None]) > 1:
    raise ConfigError("--merge, --rejudge and --shard: give one (run the shards, then --merge)")
  if _REJUDGE.value:
    outcome = sweep.rejudge(config, _WORKDIR.value, command=command)
  elif _MERGE.value:
    outcome = sweep.merge(config, _WORKDIR.value, command=command)
  else:
    shard = None if _SHARD.value is None else shards.parse(_SHARD.value)
    outcome = sweep.run(config, _WORKDIR.value, command=command, shard=shard)
  if isinstance(outcome, sweep.PartOutcome):
    done = ", ".join(outcome.evaluated) or "none (every stored record was current)"
    print(f"shard {outcome.shard}: evaluated {done}; still missing "
          f"{', '.join(outcome.missing)} (run their shards, or --merge once they are done)")
    return
  print(outcome.table)
  print("\nverdicts:\n" + "\n".join(f"- {line}" for line in outcome.verdicts))
  print("\nclaims:\n" + "\n".join(f"- {c.id} {c.verdict} (seeds {c.seeds_agreeing}): "
                                    f"{c.statement}" for c in outcome.claims))
  print(f"\nreport: {outcome.report_path}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  cli.quiet_library_logs()
  cli.enable_compilation_cache()
  studies.install()
  try:
    cli.initialize_distributed()
    if _CONFIG.value is not None:
      _run_sweep(_CONFIG.value)
      return
    if _SHARD.value is not None or _MERGE.value or _REJUDGE.value:
      raise ConfigError("--shard/--merge/--rejudge need a sweep config: --config "
                        "configs/sweeps/<name>.py")
    result = heldout_lib.evaluate_checkpoint(_WORKDIR.value, _EVAL_BATCHES.value,
                                          allow_unfinished=_ALLOW_UNFINISHED.value)
  except (ConfigError, UnreadableFile, sweep.Interrupted, run_lock.Locked) as e:
    raise SystemExit(cli.one_line_error(e)) from None
  print(json.dumps(result, indent=2, sort_keys=True))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
