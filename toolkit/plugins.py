"""Places to run beyond the built-in ones, as plugins: the modules named in ``LBL_EXECUTORS``
(comma-separated, importable), each registering its executor
(:func:`toolkit.launching.executors.registry.register`) and the config section that asks for
it (:data:`SECTIONS`). Every process of the lab loads them when it first needs one: the CLI
and the app with the registry, a worker when its config names a section it does not know, so
a run's supervisor and workers, started with the same environment, know its place too."""

from __future__ import annotations

import importlib
import os

from pydantic import BaseModel

ENV = "LBL_EXECUTORS"
SECTIONS: dict[str, type[BaseModel]] = {}
"""The config sections registered executors declare (name -> its model)."""
_loaded = False


def load() -> None:
    """Import the modules named in ``LBL_EXECUTORS``, once per process."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for name in filter(None, (name.strip() for name in os.environ.get(ENV, "").split(","))):
        importlib.import_module(name)
