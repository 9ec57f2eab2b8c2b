"""What every notebook shares: the Colab badge and the setup cell (install, or import the
checkout)."""

from __future__ import annotations

REPOSITORY = "chunkformer/chunkformer"


def colab_badge(name: str) -> str:
  url = f"https://colab.research.google.com/github/{REPOSITORY}/blob/main/notebooks/{name}.ipynb"
  return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({url})"
          f"\n(or open `{url}`)")


def setup_cell(extra: str = "") -> str:
  """The first code cell: install in Colab, make a source checkout importable, else nothing."""
  return f'''# Setup. In Colab: install chunkformer from GitHub (about a minute). From a checkout
# of the repository (this notebook in notebooks/), import it from there. Else nothing to do.
import importlib.util
import os
import subprocess
import sys

if "google.colab" in sys.modules:
  subprocess.check_call([sys.executable, "-m", "pip", "install", "-q",
                         "git+https://github.com/{REPOSITORY}"]){extra}
elif importlib.util.find_spec("chunkformer") is None and os.path.isdir("../chunkformer"):
  sys.path.insert(0, os.path.abspath(".."))'''

# Colab's GPU runtime needs the CUDA build of the pinned jax for the kernels to run natively.
GPU_JAX = """
  import shutil
  if shutil.which("nvidia-smi"):  # a GPU runtime
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q",
                           "jax[cuda12]==0.10.2"])"""
