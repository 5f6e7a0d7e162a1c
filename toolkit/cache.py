"""What the lab keeps on this machine from run to run, under ``$LBL_CACHE`` (default
``~/.cache/large-batch-lab``): the generated datasets (``datasets/``), on JAX the compiled
train and test steps (``jax/``), and the Horovod wheels ``scripts/setup.sh`` builds (the same
variable there). Deleting it loses nothing but the time to make them again."""

from __future__ import annotations

import os
from pathlib import Path

ENV = "LBL_CACHE"
"""Environment variable overriding the cache's root."""


def folder(name: str) -> Path:
    """The cache's folder ``name`` (not created)."""
    return Path(os.environ.get(ENV, "~/.cache/large-batch-lab")).expanduser() / name
