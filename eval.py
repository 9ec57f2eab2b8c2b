"""Evaluates trained runs.

  python eval.py --workdir DIR [--eval_batches N]
      held-out metrics (loss, accuracy, near/far accuracy) of the newest checkpoint in DIR,
      using the config recorded there, as JSON on stdout;
  python eval.py --config configs/sweeps/<name>.py --workdir DIR [--config.sweep.x=v]
      a periodicity sweep: trains the variants without a finished run in DIR/<variant>/
      (resumable), evaluates all, writes DIR/results.json, DIR/report.md and DIR/plots/, and
      ends by printing the comparison table and the path of report.md.
"""

import json
import shlex
import sys

from absl import app, flags

from chunkformer import cli, evaluate
from chunkformer.config import ConfigError
from chunkformer.evaluation import sweep, sweep_config

_CONFIG = cli.define_config_flag(required=False)
_WORKDIR = cli.define_workdir_flag()
_EVAL_BATCHES = flags.DEFINE_integer("eval_batches", None,
                                     "held-out batches (default: the run's train.eval_batches)")
_ALLOW_UNFINISHED = flags.DEFINE_bool("allow_unfinished", False,
                                      "evaluate the newest checkpoint of an unfinished run")
cli.define_distributed_flags()


def _run_sweep(config) -> None:
  if not sweep_config.is_sweep_config(config):
    raise ConfigError("config field 'sweep' is missing: --config must be a sweep config "
                      "(configs/sweeps/*.py); train configs go to train.py")
  outcome = sweep.run(config, _WORKDIR.value, command=shlex.join(["python"] + sys.argv))
  print(outcome.table)
  print("\nverdicts:\n" + "\n".join(f"- {line}" for line in outcome.verdicts))
  print(f"\nreport: {outcome.report_path}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  cli.quiet_library_logs()
  cli.enable_compilation_cache()
  try:
    cli.initialize_distributed()
    if _CONFIG.value is not None:
      _run_sweep(_CONFIG.value)
      return
    result = evaluate.evaluate_checkpoint(_WORKDIR.value, _EVAL_BATCHES.value,
                                          allow_unfinished=_ALLOW_UNFINISHED.value)
  except (ConfigError, sweep.Interrupted) as e:
    raise SystemExit(f"error: {e}") from None
  print(json.dumps(result, indent=2, sort_keys=True))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
