"""A Hugging Face checkpoint directory on disk: config.json plus safetensors weight files.

Reads with the ``safetensors`` library's numpy API (no torch): sharded checkpoints through
``model.safetensors.index.json``, unsharded ones from ``model.safetensors`` (or every
``*.safetensors`` file in the directory). ``inventory`` lists every tensor's file, dtype and
shape from the file headers alone, so a checkpoint can be checked completely before any weight
is read. Errors are ``CheckpointError`` naming the file.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"


class CheckpointError(ValueError):
  """A checkpoint directory or file that cannot be converted (the message names it)."""


def read_config(directory: str) -> dict[str, Any]:
  """``directory/config.json`` as a dict; CheckpointError naming the path if absent or bad."""
  if not os.path.isdir(directory):
    raise CheckpointError(f"checkpoint directory {directory!r} does not exist")
  path = os.path.join(directory, CONFIG_FILE)
  if not os.path.isfile(path):
    raise CheckpointError(f"{path}: missing (a Hugging Face checkpoint directory holds "
                          f"{CONFIG_FILE} and *.safetensors)")
  try:
    with open(path) as f:
      config = json.load(f)
  except json.JSONDecodeError as e:
    raise CheckpointError(f"{path}: not valid JSON ({e})") from None
  if not isinstance(config, dict):
    raise CheckpointError(f"{path}: expected a JSON object")
  return config


def _weight_files(directory: str) -> list[str]:
  index = os.path.join(directory, INDEX_FILE)
  if os.path.isfile(index):
    with open(index) as f:
      weight_map = json.load(f).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
      raise CheckpointError(f"{index}: no 'weight_map'")
    files = sorted(set(weight_map.values()))
    for name in files:
      if not os.path.isfile(os.path.join(directory, name)):
        raise CheckpointError(f"{os.path.join(directory, name)}: listed in {INDEX_FILE} but "
                              "missing")
    return [os.path.join(directory, name) for name in files]
  single = os.path.join(directory, WEIGHTS_FILE)
  if os.path.isfile(single):
    return [single]
  files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
  if not files:
    raise CheckpointError(f"{directory}: no {WEIGHTS_FILE}, {INDEX_FILE} or *.safetensors file")
  return files


def inventory(directory: str) -> dict[str, tuple[str, str, tuple[int, ...]]]:
  """tensor name -> (file, safetensors dtype, shape), from the headers only.

  A name stored in two files is a CheckpointError naming both.
  """
  out: dict[str, tuple[str, str, tuple[int, ...]]] = {}
  for path in _weight_files(directory):
    try:
      with safe_open(path, framework="np") as f:
        for name in f.keys():
          piece = f.get_slice(name)
          if name in out:
            raise CheckpointError(f"tensor {name!r} is stored twice: {out[name][0]} and {path}")
          out[name] = (path, piece.get_dtype(), tuple(piece.get_shape()))
    except CheckpointError:
      raise
    except Exception as e:  # noqa: BLE001 -- safetensors raises its own error types
      raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None
  return out


def read_tensors(entries: dict[str, tuple[str, str, tuple[int, ...]]]) -> dict[str, np.ndarray]:
  """Every tensor of ``inventory``'s answer as float32 numpy (bf16 via ml_dtypes, exact)."""
  by_file: dict[str, list[str]] = {}
  for name, (path, _, _) in entries.items():
    by_file.setdefault(path, []).append(name)
  out = {}
  for path, names in by_file.items():
    with safe_open(path, framework="np") as f:
      for name in names:
        out[name] = np.asarray(f.get_tensor(name), np.float32)
  return out


def check_writable(directory: str) -> None:
  """Refuses a directory that already holds a checkpoint (nothing is ever replaced)."""
  for name in (CONFIG_FILE, WEIGHTS_FILE, INDEX_FILE):
    if os.path.exists(os.path.join(directory, name)):
      raise CheckpointError(f"{os.path.join(directory, name)} exists; choose an empty output "
                            "directory (nothing was written)")


def write_checkpoint(directory: str, config: dict[str, Any],
                     tensors: dict[str, np.ndarray]) -> None:
  """Writes ``config.json`` and one ``model.safetensors``; refuses to replace existing ones."""
  check_writable(directory)
  os.makedirs(directory, exist_ok=True)
  weights = os.path.join(directory, WEIGHTS_FILE)
  save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, weights + ".tmp",
            metadata={"format": "pt"})  # "pt": what transformers expects of safetensors files
  os.replace(weights + ".tmp", weights)
  path = os.path.join(directory, CONFIG_FILE)
  with open(path + ".tmp", "w") as f:
    json.dump(config, f, indent=2, sort_keys=True)
  os.replace(path + ".tmp", path)
