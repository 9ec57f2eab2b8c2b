"""The device mesh (``mesh``) and the rules mapping logical axis names onto it.

``context`` is context parallelism: the token dimension of every activation (logical name
``length``) is split over that many devices, so one long row spans several devices. The
attention kinds' XLA paths are partitioned by GSPMD, which inserts the communication; full
attention's keys and values either arrive that way (``context_strategy = "all_gather"``) or
travel round a ring of the context devices (``"ring"``, attention/ring.py), optionally with the
causal load balancing of ``context_load_balance`` (attention/load_balance.py).
"""

from __future__ import annotations

import dataclasses

from chunkformer.config_sections.errors import one_of, require

CONTEXT_STRATEGIES = ("all_gather", "ring")  # how full attention's K/V cross the context axis

DEFAULT_AXIS_RULES = (
    ("batch", ("data", "fsdp")),
    ("length", "context"),  # tokens of a row: split over the context axis
    ("embed", "fsdp"),
    ("act_embed", None),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("entries", None),
    ("slots", None),
)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Device mesh. ``data = -1`` (or ``fsdp = -1``) takes every device the other axes leave."""

  data: int = -1
  fsdp: int = 1  # -1: fully sharded data parallel over every device data, context, tensor leave
  context: int = 1  # devices one row's tokens are split over (context parallelism)
  tensor: int = 1
  # Full attention's K/V over the context axis: all_gather (GSPMD gathers them whole) | ring
  # (each device's K/V block passed round the context devices, context - 1 hops).
  context_strategy: str = "all_gather"
  # Ring only: device d holds token chunks d and 2*context-1-d of 2*context, so each device
  # does the same causal work (every layer full attention; data.seq_len % (2*context) == 0).
  context_load_balance: bool = False
  axis_rules: tuple = DEFAULT_AXIS_RULES  # logical axis -> mesh axes

  def validate(self) -> None:
    """The fields that need no other section (Config checks them against the model and data)."""
    one_of(self.context_strategy, CONTEXT_STRATEGIES, "mesh.context_strategy")
    require(self.context_strategy != "ring" or self.context > 1, "mesh.context_strategy",
            f"'ring' passes K/V round the context devices and needs mesh.context > 1, got "
            f"{self.context}")
    if self.context_strategy == "ring":
      length = dict((name, axes) for name, axes in self.axis_rules).get("length")
      if isinstance(length, (list, tuple)) and len(length) == 1:
        length = length[0]
      require(isinstance(length, str), "mesh.axis_rules",
              f"'ring' passes K/V blocks along the one mesh axis that splits the tokens, but "
              f"'length' maps to {length!r}")
    require(not self.context_load_balance or self.context_strategy == "ring",
            "mesh.context_load_balance", "reorders the tokens for the ring's causal work; it "
            f"needs mesh.context_strategy = 'ring', got {self.context_strategy!r}")

  def shape(self, device_count: int) -> tuple[int, int, int, int]:
    """Resolved (data, fsdp, context, tensor); ConfigError if it does not match the devices."""
    require(self.tensor >= 1, "mesh.tensor", "must be >= 1")
    require(self.context >= 1, "mesh.context", "must be >= 1")
    for name in ("data", "fsdp"):
      require(getattr(self, name) == -1 or getattr(self, name) >= 1, f"mesh.{name}",
              "must be >= 1 or -1 (auto)")
    require(self.data != -1 or self.fsdp != -1, "mesh.fsdp",
            "only one of mesh.data and mesh.fsdp may be -1 (auto)")
    data, fsdp = self.data, self.fsdp
    if -1 in (data, fsdp):
      rest = self.context * self.tensor * (fsdp if data == -1 else data)
      require(device_count % rest == 0, "mesh",
              f"the fixed mesh axes ({rest} devices) do not divide the {device_count} devices")
      data, fsdp = (device_count // rest, fsdp) if data == -1 else (data, device_count // rest)
    total = data * fsdp * self.context * self.tensor
    require(total == device_count, "mesh",
            f"data*fsdp*context*tensor = {data}*{fsdp}*{self.context}*{self.tensor} = {total} "
            f"does not match the {device_count} devices")
    return data, fsdp, self.context, self.tensor
