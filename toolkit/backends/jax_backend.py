"""Keras on JAX: several workers are one JAX program (:mod:`toolkit.backends.jax_engine`)
whose compiled step averages the gradients itself; Horovod carries the run's small collectives
only (records, checkpoints' gathers, metric averages)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from toolkit.backends import jax_engine
from toolkit.backends.base import Backend
from toolkit.backends.devices import pin_tensorflow_gpu

if TYPE_CHECKING:
    import keras


class JaxBackend(Backend):
    """Keras's JAX backend (see the module's docstring)."""

    name = "jax"
    lacks = (
        "JAX's engine averages float32 gradients inside the compiled step, where no hook sees "
        "a worker's own gradient to encode, and jax.distributed has no elastic world"
    )
    averages_in_step = True
    jit_compile = True
    stateless_step = True

    def start_worker(self, engine: Any) -> None:
        """Join the other workers as one JAX program (with more than one); TensorFlow, which
        reads the data, sees only the GPU the local rank names."""
        if engine.size() > 1:  # named: rank 0 sends a str, the others None, and Horovod
            # would name each broadcast by its value's type, so the ranks would never meet
            broadcast = functools.partial(engine.broadcast_object, root_rank=0, name="coordinator")
            jax_engine.start(engine.rank(), engine.size(), broadcast)
        pin_tensorflow_gpu(engine.local_rank(), engine.local_size())

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        with jax_engine.alone():
            yield

    def state_dtype(self) -> str:
        """``float64`` only with ``jax_enable_x64``; ``float32`` otherwise (JAX has no float64)."""
        import jax

        return "float64" if jax.config.jax_enable_x64 else "float32"

    def compiled(self, function: Callable) -> Callable:
        import jax

        return jax.jit(function)

    def _gradients_of(self, model: keras.Model, x, y) -> Callable:
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
