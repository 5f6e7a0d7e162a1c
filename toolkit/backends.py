"""What differs between Keras's backends, in one place: how a function is compiled, and how a
model's loss gradients are taken outside its training step.

The optimizers, schedules and AdaScale are written with ``keras.ops`` and run on every backend
(``KERAS_BACKEND``: ``tensorflow``, ``jax`` or ``torch``), and so does a one-worker run, whose
input pipeline is ``tf.data``, which Keras feeds to any backend. Horovod's allreduce is
TensorFlow's: what needs it is refused on the others before anything starts
(:func:`toolkit.config_rules.check_backend`). Importing this module imports no Keras, so that a
launcher can ask which backend its workers will get (:func:`requested`).
"""

from __future__ import annotations

import json
import os
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import keras


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


BACKENDS = ("tensorflow", "jax", "torch")
"""Keras's backends, the names ``KERAS_BACKEND`` takes."""


def chosen(backend: str | None) -> str:
    """``backend`` for a launch (``None``: :func:`requested`); ``ValueError`` naming the
    allowed ones if it is not one of Keras's."""
    backend = backend or requested()
    if backend not in BACKENDS:
        raise ValueError(f"KERAS_BACKEND must be one of {', '.join(BACKENDS)}, got {backend!r}")
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
    return found if found in BACKENDS else None


def name() -> str:
    """The Keras backend this process runs: ``tensorflow``, ``jax`` or ``torch``."""
    import keras

    return keras.backend.backend()


def compiled(function: Callable) -> Callable:
    """``function`` compiled as the backend compiles: a ``tf.function`` on TensorFlow (no
    autograph), ``jax.jit`` on JAX, itself on PyTorch (eager, as Keras's PyTorch trainer)."""
    if name() == "tensorflow":
        import tensorflow as tf

        return tf.function(function, autograph=False)
    if name() == "jax":
        import jax

        return jax.jit(function)
    return function


_GRADIENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def loss_gradients(model: keras.Model, x, y) -> list:
    """The gradients of ``model``'s compiled loss on ``(x, y)``, one per trainable variable,
    the model run with ``training=False`` (no dropout, batch norm's moving statistics
    untouched). Compiled once per model (eagerly a gradient costs several times a compiled
    one; tracing one costs about a second for a ResNet), for any batch size."""
    if model not in _GRADIENTS:
        build = {"tensorflow": _tensorflow, "jax": _jax, "torch": _torch}[name()]
        _GRADIENTS[model] = build(model, x, y)  # x, y: the shapes and dtypes to compile for
    return _GRADIENTS[model](x, y)


def _tensorflow(model: keras.Model, x, y) -> Callable:
    import tensorflow as tf

    def gradients(x, y):
        with tf.GradientTape() as tape:
            loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=False))
        return tape.gradient(loss, model.trainable_variables)

    shapes = [tf.TensorSpec([None, *x.shape[1:]], x.dtype), tf.TensorSpec([None], y.dtype)]
    return tf.function(gradients, input_signature=shapes, autograph=False)


def _jax(model: keras.Model, x, y) -> Callable:
    import jax

    def gradients(trainable, non_trainable, metrics, x, y):
        grad = jax.grad(model.compute_loss_and_updates, has_aux=True)
        return grad(trainable, non_trainable, metrics, x, y, None, training=False)[0]

    compiled_gradients = jax.jit(gradients)

    def current(variables):
        return [v.value for v in variables]

    return lambda x, y: compiled_gradients(
        current(model.trainable_variables),
        current(model.non_trainable_variables),
        current(model.metrics_variables),
        x,
        y,
    )


def _torch(model: keras.Model, x, y) -> Callable:
    from keras import ops

    def gradients(x, y):
        x, y = ops.convert_to_tensor(x), ops.convert_to_tensor(y)
        model.zero_grad()
        loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=False))
        loss.backward()
        grads = [v.value.grad for v in model.trainable_variables]
        model.zero_grad()
        return grads

    return gradients
