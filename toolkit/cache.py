"""What the lab keeps on this machine from run to run, under ``$LARGE_BATCH_LAB_CACHE``
(default ``~/.cache/large-batch-lab``): the generated datasets (``datasets/``) and, on JAX, the
compiled train and test steps (``jax/``). Deleting it loses nothing but the time to make them
again."""

from __future__ import annotations

import os
from pathlib import Path

ENV = "LARGE_BATCH_LAB_CACHE"
"""Environment variable overriding the cache's root."""


def folder(name: str) -> Path:
    """The cache's folder ``name`` (not created)."""
    return Path(os.environ.get(ENV, "~/.cache/large-batch-lab")).expanduser() / name
