"""The sections of the run config: frozen dataclasses whose ``validate`` checks their own fields.

``chunkformer/config.py`` composes them into ``Config`` (the public surface: import sections
from there) and adds the checks that need more than one section or the data tasks. This package
is a leaf: it imports nothing from chunkformer, so ``chunkformer/data/``, which owns the task
checks of the data section, can use ``DataConfig`` and ``ConfigError`` while ``config.py``
imports ``data`` without an import cycle.

Each field carries a one-line comment with its unit; ``configs/base.py`` takes its defaults
from here.
"""
