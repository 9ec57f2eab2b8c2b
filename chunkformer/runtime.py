"""What training and evaluation share: mesh, model, optimiser, shardings and the batch feed.

``build`` checks everything that can be checked without compiling (the config, the mesh against
the device count, the batch against the mesh) and raises ConfigError naming the field.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import flax.linen as nn
import jax
import optax
from jax.sharding import Mesh, NamedSharding

from chunkformer import checkpointing, run_tokens, warm_start
from chunkformer import data as data_lib
from chunkformer import sharding as sharding_lib
from chunkformer import train_state as state_lib
from chunkformer import workdir as workdir_lib
from chunkformer.config import Config, ConfigError
from chunkformer.model import Transformer


@dataclasses.dataclass(frozen=True)
class Runtime:
  config: Config
  mesh: Mesh
  model: nn.Module
  tx: optax.GradientTransformation
  abstract_state: state_lib.TrainState  # ShapeDtypeStructs carrying their shardings
  state_shardings: state_lib.TrainState
  rules: sharding_lib.Rules  # logical axis rules fitted to this model and mesh
  batch_sharding: NamedSharding
  row_block: tuple[int, int]  # (index, count): the rows of each global batch this process feeds
  # kv rows in the tokens of the pretrained model this run starts from (run_tokens.py)
  token_map: run_tokens.TokenMap | None = None
  feed: Any = None  # data.feed.CorpusFeed for task "corpus" (stateful); None: batches by step

  @contextlib.contextmanager
  def context(self) -> Iterator[None]:
    """Mesh and axis rules for tracing: the model's activation constraints resolve here."""
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      yield

  @property
  def tokens_per_step(self) -> int:
    return self.config.data.batch_size * self.config.data.seq_len

  def batch(self, split: str, step: int) -> dict[str, jax.Array]:
    """Global batch ``step`` of ``split`` as sharded arrays; this process computes its rows."""
    index, count = self.row_block
    if self.feed is not None:
      return sharding_lib.global_batch(self.feed.batch(split, step), self.batch_sharding,
                                       self.config.data.batch_size)
    local = data_lib.make_batch(self.config.data, seed=self.config.seed, step=step, split=split,
                                process_index=index, process_count=count)
    if self.token_map is not None:
      local = self.token_map.batch(local)
    return sharding_lib.global_batch(local, self.batch_sharding, self.config.data.batch_size)

  def init_state(self) -> state_lib.TrainState:
    """Step 0: fresh parameters, or those of ``init.from_workdir`` where it has them."""
    state = self.fresh_state()
    if self.config.init.from_workdir:
      _, _, params, step = restore_newest(self.config.init.from_workdir)
      state = warm_start.load_into(self.config, state, params, step)
    return state

  def fresh_state(self) -> state_lib.TrainState:
    rng = jax.random.fold_in(jax.random.key(self.config.seed), 0)
    return state_lib.create(self.model, self.tx, self.config, self.mesh, self.state_shardings,
                            rng)

  def phase_root(self) -> jax.Array:
    """Root of the per-step training rng ('phase'), independent of the init rng."""
    return jax.random.fold_in(jax.random.key(self.config.seed), 1)


def build(config: Config, devices: Sequence[jax.Device] | None = None) -> Runtime:
  """Everything but the state itself, for ``devices`` (default: all devices of all processes)."""
  config.validate()
  mesh = sharding_lib.make_mesh(config.mesh, devices)
  model = Transformer(config.model, kv_exchange=config.mesh.context_strategy,
                      load_balance=config.mesh.context_load_balance)
  tx = warm_start.optimizer(config, state_lib.make_optimizer(config.train))
  abstract, shardings, rules = state_lib.abstract_state(model, tx, config, mesh)
  batch_sharding = sharding_lib.batch_sharding(mesh, rules)
  sharding_lib.check_batch(config.data.batch_size, batch_sharding)
  row_block = sharding_lib.process_rows(batch_sharding,
                                        (config.data.batch_size, config.data.seq_len))
  feed = None
  if config.data.task == "corpus":
    from chunkformer.data import feed as feed_lib  # lazy: grain only for task corpus

    d = config.data
    feed = feed_lib.CorpusFeed(
        feed_lib.open_for(d.path, d.tokenizer, d.heldout_fraction), seq_len=d.seq_len,
        rows=d.batch_size // row_block[1], seed=config.seed, shard_index=row_block[0],
        shard_count=row_block[1], read_threads=d.read_threads, needles=d.code_needles,
        near_distance=d.near_distance)
  return Runtime(config, mesh, model, tx, abstract, shardings, rules, batch_sharding, row_block,
                 token_map=run_tokens.for_run("", config), feed=feed)


def restore_newest(workdir: str) -> tuple[Config, Runtime, Any, int]:
  """``(config, runtime, params, step)`` of the newest checkpoint of ``workdir`` that restores,
  read only, under the run's recorded config; ConfigError naming the directory if none does."""
  config = workdir_lib.read_config(workdir)
  rt = build(config)
  restored = checkpointing.restore_latest_read_only(workdir, config.train, rt.abstract_state)
  if restored is None:
    raise ConfigError(f"workdir {workdir!r} holds no checkpoint that restores")
  state, step = restored
  return config, rt, state.params, step
