"""The paper's probes (``configs/sweeps/paper_protocol.py``) with the lookup task, the long
needle test, gate cycling and the knockouts in a loaded model's own single-token words
(``vocabulary = "words"``, ``chunkformer/data/word_tokens.py``): for run directories of
imported checkpoints with a tokenizer.json and of corpus models.

  python eval.py --config configs/sweeps/paper_words.py:runs/qwen3 --workdir DIR \\
      [--config.sweep.probes.lookup.num_keys=256] [--config.sweep.probes.lookup.word_seed=1]

The word options are in the config (0: every word found, split in halves, seed 0) so that
each can be overridden on the command line per probe.
"""

from configs.sweeps import paper_protocol

WORD_PROBES = ("lookup", "long_needle", "gate_cycling", "head_knockout")


def get_config(names: str = ""):
  if not names:
    raise ValueError("name run directories of models with a tokenizer: "
                     "--config configs/sweeps/paper_words.py:RUN1,RUN2")
  config = paper_protocol.get_config(names)
  config.sweep.name = "paper_words"
  for name in WORD_PROBES:
    config.sweep.probes[name].update(vocabulary="words", word_seed=0, num_keys=0,
                                     num_values=0)
  return config
