"""Trains a model: python train.py --config configs/<name>.py --workdir DIR [--config.a.b=v].

Rerunning the same command resumes from the newest checkpoint in DIR; a DIR holding another
run is refused unless --overwrite, and a DIR another process is training (or evaluating) is
refused at once. Bad input ends in one line "error: ..." (--verbosity=1 adds the traceback).
Multi-process: add --coordinator=HOST:PORT --num_processes=N --process_id=I (or the
CHUNKFORMER_* variables). Compiled programs are cached
in ~/.cache/chunkformer/jax (or $JAX_COMPILATION_CACHE_DIR), so a resumed run starts quickly.
"""

import json

from absl import app, logging

from chunkformer import cli, run_lock, trainer

_CONFIG = cli.define_config_flag()
_WORKDIR = cli.define_workdir_flag()
_OVERWRITE = cli.define_overwrite_flag()
cli.define_distributed_flags()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  cli.quiet_library_logs()
  cli.enable_compilation_cache()
  try:
    cli.initialize_distributed()
    config = cli.config_from_flags(_CONFIG)
    final = trainer.train(config, _WORKDIR.value, overwrite=_OVERWRITE.value)
  except (ValueError, run_lock.Locked, FloatingPointError) as e:  # ConfigError included
    raise SystemExit(cli.one_line_error(e)) from None
  logging.info("final metrics: %s", json.dumps(final, sort_keys=True))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
