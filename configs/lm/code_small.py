"""A small language model on the Python standard library's source (the built-in corpus).

  python train.py --config configs/lm/code_small.py --workdir DIR           # byte level
  python train.py --config configs/lm/code_small.py:bpe2048 --workdir DIR   # byte-level BPE

The corpus is ingested on first use into ~/.cache/chunkformer (or $CHUNKFORMER_DATA_CACHE);
with ``bpeN`` a BPE of N ids is trained there first on the train split. Held-out loss is also
reported as bits per byte, which compares the two tokenizers.
"""

from configs import base


def get_config(tokenizer: str = "bytes"):
  c = base.get_config()
  c.data.task = "corpus"
  c.data.path = "builtin:stdlib"
  if tokenizer == "bytes":
    c.data.tokenizer = "bytes"
    c.model.vocab_size = 260  # 256 bytes + the byte tokenizer's specials
  elif tokenizer.startswith("bpe"):
    vocab = int(tokenizer[3:])
    c.data.tokenizer = f"bpe:{vocab}"
    c.model.vocab_size = vocab
  else:
    raise ValueError(f"config argument: 'bytes' or 'bpeN' (e.g. bpe2048), got {tokenizer!r}")
  c.model.num_layers = 2
  c.model.d_model = 128
  c.model.num_heads = 4
  c.model.num_kv_heads = 4
  c.model.head_dim = 32
  c.model.mlp_dim = 512
  c.model.attention.kind = "full"
  c.data.seq_len = 256
  c.data.batch_size = 8
  c.data.read_threads = 2
  c.train.steps = 600  # sized for 2 shared CPU cores (time: bench/results/measurements.md)
  c.train.learning_rate = 2e-3
  c.train.warmup_steps = 50
  c.train.log_every = 50
  c.train.eval_every = 200
  c.train.eval_batches = 8
  c.train.checkpoint_every = 200
  return c
