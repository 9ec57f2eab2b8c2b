"""Defaults shared by every config: the frozen dataclass defaults of chunkformer.config.

Field meanings and units are documented once, on the dataclasses in chunkformer/config_sections/.
"""

import ml_collections

from chunkformer import config as cfg_lib


def get_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(cfg_lib.to_dict(cfg_lib.Config()))
