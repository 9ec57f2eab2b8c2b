"""Paper run ``w8s8_2kv`` (fields: configs/paper/runs.py; table: docs/paper_runs.md).

CPU size (default) and the paper's Qwen3-0.6B size (argument ``paper``):
  python train.py --config configs/paper/w8s8_2kv.py --workdir DIR
  python train.py --config configs/paper/w8s8_2kv.py:paper --workdir DIR
"""

from configs.paper import runs


def get_config(size: str = "cpu"):
  return runs.get_run_config("w8s8_2kv", size)
