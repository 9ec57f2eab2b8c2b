"""The device mesh (``mesh``) and the rules mapping logical axis names onto it.

``context`` is context parallelism: the token dimension of every activation (logical name
``length``) is split over that many devices, so one long row spans several devices. The
attention kinds' XLA paths are partitioned by GSPMD, which inserts the communication.
"""

from __future__ import annotations

import dataclasses

from chunkformer.config_sections.errors import require

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
  axis_rules: tuple = DEFAULT_AXIS_RULES  # logical axis -> mesh axes

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
