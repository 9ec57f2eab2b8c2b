"""The parameters a finished or running test run saved at one step (its checkpoint)."""

from chunkformer import checkpointing
from chunkformer import runtime as runtime_lib


def params_at(workdir: str, config, step: int):
  """Params of ``workdir``'s step-``step`` checkpoint, restored into ``config``'s layout."""
  rt = runtime_lib.build(config)
  checkpointer = checkpointing.Checkpointer(workdir, config.train, read_only=True)
  try:
    return checkpointer.manager.restore(
        step, args=checkpointing.ocp.args.StandardRestore(rt.abstract_state)).params
  finally:
    checkpointer.close()
