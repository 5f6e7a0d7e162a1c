"""Keras's backends as objects: what differs between TensorFlow, PyTorch and JAX, in one place.

Every backend the lab trains on is a :class:`~toolkit.backends.base.Backend` in
:data:`REGISTRY`: what it can do, as attributes the config's rules read before anything starts
(:func:`toolkit.config_rules.check_backend`), and what it does differently once a worker runs
(its Horovod, its compiled step, its conditionals in a graph or eagerly). A process asks for
its own once, :func:`current`; the rest of the toolkit takes that object and never asks a
backend's name. The optimizers, schedules and AdaScale are written with ``keras.ops`` and run
on every backend, and so does the input pipeline, ``tf.data``, which Keras feeds to any.

Importing this package, or a backend's module, imports no Keras, so that a launcher can ask
which backend its workers will get (:func:`requested`) and what that one runs (:func:`of`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from toolkit.backends.base import Backend
from toolkit.backends.jax_backend import JaxBackend
from toolkit.backends.tensorflow_backend import TensorFlowBackend
from toolkit.backends.torch_backend import TorchBackend

REGISTRY: dict[str, type[Backend]] = {
    backend.name: backend for backend in (TensorFlowBackend, JaxBackend, TorchBackend)
}
"""Each Keras backend the lab trains on, by the name ``KERAS_BACKEND`` gives it."""


def requested() -> str:
    """The backend Keras will load in a process started from here, as Keras chooses it:
    ``KERAS_BACKEND``, else the ``backend`` of ``$KERAS_HOME/keras.json`` (default
    ``~/.keras``), else ``tensorflow``."""
    if chosen := os.environ.get("KERAS_BACKEND"):
        return chosen
    home = Path(os.environ.get("KERAS_HOME") or Path.home() / ".keras")
    try:
        return json.loads((home / "keras.json").read_text()).get("backend", "tensorflow")
    except (OSError, ValueError, AttributeError):
        return "tensorflow"


BACKENDS = tuple(REGISTRY)
"""Keras's backends the lab trains on, the names ``KERAS_BACKEND`` takes."""


def chosen(backend: str | None) -> str:
    """``backend`` for a launch (``None``: :func:`requested`); ``ValueError`` naming the
    allowed ones if it is not one of Keras's."""
    backend = backend or requested()
    of(backend)
    return backend


def of_run(meta: dict) -> str:
    """The backend a run trains on, from its ``meta.json``: the one it was launched on (its
    ``keras_backend``; for a run from before that field, the one its workers recorded), else
    the one a launch from here gets (:func:`requested`). A resumed run's workers get it
    whatever this process's ``KERAS_BACKEND``: a checkpoint reads back on its own backend."""
    return recorded(meta) or requested()


def recorded(meta: dict) -> str | None:
    """The backend a run's ``meta.json`` records: the launch's (``keras_backend``), else the
    one its workers ran (``versions``); ``None`` for a run that records neither."""
    versions = meta.get("versions")
    workers = versions.get("keras_backend") if isinstance(versions, dict) else None
    found = meta.get("keras_backend") or workers
    return found if found in REGISTRY else None


def import_for_a_worker() -> None:
    """Import Keras and TensorFlow (every worker's input pipeline is ``tf.data``) as a worker
    of :func:`requested` needs them: without what they import only because it is installed
    and the worker never calls (:attr:`Backend.unused_imports`; 1.4 s of CPU of a TensorFlow
    worker's start). Those libraries import as usual afterwards, and one already imported is
    not touched. Python's rule does it: importing a name whose ``sys.modules`` entry is
    ``None`` fails as if it were not installed."""
    unused = REGISTRY[name].unused_imports if (name := requested()) in REGISTRY else ()
    left_out = [module for module in unused if module not in sys.modules]
    sys.modules.update(dict.fromkeys(left_out))
    try:
        import keras  # noqa: F401
        import tensorflow  # noqa: F401
    finally:
        for module in left_out:
            if sys.modules.get(module, ...) is None:
                del sys.modules[module]


def of(backend: str) -> Backend:
    """The :class:`~toolkit.backends.base.Backend` called ``backend`` (one of
    :data:`BACKENDS`; ``ValueError`` naming them otherwise). Imports no Keras."""
    if backend not in REGISTRY:
        raise ValueError(f"KERAS_BACKEND must be one of {', '.join(REGISTRY)}, got {backend!r}")
    return REGISTRY[backend]()


def current() -> Backend:
    """The backend this process's Keras runs."""
    import keras

    return of(keras.backend.backend())
