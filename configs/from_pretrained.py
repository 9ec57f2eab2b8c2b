"""Continue training a run directory (e.g. an imported Qwen3) with compressed attention.

  python train.py --config configs/from_pretrained.py:runs/qwen3_0p6b --workdir runs/qwen3_m4 \\
      --config.model.layer_pattern='kind=fixed,chunk_size=4,window=128;' \\
      --config.init.train_only_new_steps=200

The model is the source run's (``RUN/config.json``) and its weights start this run
(``init.from_workdir``); what may change is the attention layout (``model.attention``,
``model.layer_pattern``: here layers 0, 2, ... become fixed M = 4 chunks with a 128-token
window, layers 1, 3, ... stay full), added token shifts, and the dtype. Compressor weights are
freshly initialised; with ``init.train_only_new_steps = N`` only they train for the first N
steps. Data: the source's (an import records the kv retrieval task at its --seq_len; when the
source has a tokenizer the kv rows are spoken in its tokens, chunkformer/run_tokens.py);
for the byte-level code corpus add --config.data.task=code; for a real corpus in the model's
own tokens, ingest it with the imported tokenizer and train on the shards:

  python -m chunkformer.data.ingest --input 'TEXT_GLOB' --tokenizer RUN_DIR/tokenizer.json \
      --output SHARDS
  ... --config.data.task=corpus --config.data.path=SHARDS

Schedule: short warmup, lr 3e-4
(a pretrained model wants a smaller step than from scratch).
"""

import ml_collections

from chunkformer import config as cfg_lib
from chunkformer import workdir as workdir_lib


def get_config(source: str = "") -> ml_collections.ConfigDict:
  if not source:
    raise ValueError("name the run directory to start from: "
                     "--config configs/from_pretrained.py:RUN_DIR")
  recorded = workdir_lib.read_config(source)
  values = cfg_lib.to_dict(cfg_lib.Config(model=recorded.model, data=recorded.data,
                                          mesh=recorded.mesh))
  values["init"].update(from_workdir=source)
  values["data"].update(batch_size=8)
  values["train"].update(steps=1000, learning_rate=3e-4, warmup_steps=50)
  return ml_collections.ConfigDict(values)
