"""Fixed chunk compression (DeepSeek-V4 layout) on synthetic key-value retrieval.

  python train.py --config configs/kv_chunk.py --workdir workdirs/kv_chunk_m4

Every layer attends to a sliding window of W = 8 raw tokens plus the entries of fixed chunks of
M = 4 tokens (gated pooling with a learned slot bias, shared-KV entries, RoPE at the chunk
start), so a needle more than ``near_distance`` tokens back is reachable only through its
compressed entry. Model, data and schedule are those that make the full-attention control
learn (d = 64, heads of 16 with 4 rotating dims, 16 queries per row, lr 3e-3); the key token
shift is off here (the faithful layout), and the study runs it both ways. Held-out accuracy
plateaus near 1 - 1/M with 1-token keys and values: the needles whose key and value fall into
different chunks (phase M - 1) are lost, which is the periodic blind spot under study.

The study's variants (add to the command above, and use a workdir per variant):
  M = 2, 4, 6, 8, 12:     --config.model.attention.chunk_size=2   (... =4, =6, =8, =12)
  RoPE off:               --config.model.rope=False
  uniform pooling:        --config.model.attention.pooling=mean
  gate without slot bias: --config.model.attention.pooling=gated_no_bias
  NSA-style MLP pooling:  --config.model.attention.pooling=mlp
  overlap (CSA):          --config.model.attention.overlap=True
  staggered offsets:      --config.model.attention.stagger=heads   (or =layers)
  random phase (train):   --config.model.attention.random_phase=True
  window size:            --config.model.attention.window=16
  sink logit:             --config.model.attention.sink=True
  key token shift:        --config.model.key_shift=2
  Pallas kernels (GPU):   --config.model.attention.implementation=pallas_gpu
  DeepSeek-V4 alternation (CSA M=4 with top-k, HCA M=128):
      --config.model.layer_pattern='chunk_size=4,overlap=true,topk=16;chunk_size=128'
"""

from configs import base, common


def get_config():
  c = base.get_config()
  common.kv_model(c)  # the control's model: 4 rotating dims per head, so content matching learns
  c.model.key_shift = 0  # faithful DeepSeek-V4 layout: no local mixing before compression
  c.model.attention.kind = "fixed"
  c.model.attention.chunk_size = 4  # M, tokens per entry
  c.model.attention.window = 8  # W, raw tokens in the sliding window
  c.model.attention.pooling = "gated"  # learned gate + slot bias
  c.model.attention.overlap = False
  c.model.attention.shared_kv = True
  common.kv_task(c)  # every needle is asked: 16 answers per row of training signal
  common.schedule(c, steps=1000, learning_rate=3e-3, warmup_steps=100, eval_every=250,
                  checkpoint_every=250)
  return c
