"""One run of the paper's pretraining sweep (fields: configs/paper/runs.py; table:
docs/paper_runs.md), chosen by the argument "<run>[,<size>]": a key of ``runs.RUNS`` (or of
``runs.CURES``, the study's cures on the paper's compressor) and a size of ``runs.SIZES``
(default ``cpu``, the size that trains in minutes on two cores; ``paper`` is Qwen3-0.6B's
shape):

  python train.py --config configs/paper/run.py:w8s8_1kv --workdir DIR
  python train.py --config configs/paper/run.py:w8s8_1kv,paper --workdir DIR
"""

from configs.paper import runs


def get_config(arg: str = ""):
  run, _, size = arg.partition(",")
  if not run:
    raise ValueError("configs/paper/run.py needs its run as the argument, e.g. "
                     f"configs/paper/run.py:w8s8_1kv[,paper]; runs: {', '.join(runs.ALL_RUNS)}")
  return runs.get_run_config(run, size or "cpu")

