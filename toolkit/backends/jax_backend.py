"""Keras on JAX: several workers are one JAX program (:mod:`toolkit.backends.jax_engine`)
whose train step runs on each worker's batch and averages the gradients with JAX's own
collectives, compiled into the step; Horovod carries the run's small collectives only
(records, checkpoints' gathers, metric averages).

Its compiled step is stateless: it returns only the model's and optimizer's variables, so
state outside them that an update writes is carried as the optimizer's, and a conditional
write is a selection between the old value and the new (:mod:`toolkit.backends.jax_state`)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from toolkit import cache, codecs
from toolkit.backends import jax_engine
from toolkit.backends.base import Backend
from toolkit.backends.devices import pin_tensorflow_gpu
from toolkit.sections import SYNC_MODES

if TYPE_CHECKING:
    import keras
    import numpy as np


class JaxBackend(Backend):
    """Keras's JAX backend (see the module's docstring)."""

    name = "jax"
    codecs = (codecs.DENSE.name, codecs.FP16.name, codecs.TOPK.name, codecs.TWO_BIT.name)
    varying_payloads = False  # a compiled step's shapes are fixed
    adascale = adaptive_batch = True
    sync_modes = SYNC_MODES
    lacks = (
        "JAX compiles its step for fixed shapes, so an encoding's size cannot vary, and "
        "jax.distributed has no elastic world"
    )
    one_program = True
    jit_compile = True
    unused_imports = ("sklearn",)

    def start_worker(self, engine: Any) -> None:
        """Join the other workers as one JAX program (with more than one); TensorFlow, which
        reads the data, sees only the GPU the local rank names; compiled steps are kept in the
        lab's cache (:func:`jax_engine.keep_compiled`)."""
        jax_engine.keep_compiled(cache.folder("jax"))
        if engine.size() > 1:  # named: rank 0 sends a str, the others None, and Horovod
            # would name each broadcast by its value's type, so the ranks would never meet
            broadcast = functools.partial(engine.broadcast_object, root_rank=0, name="coordinator")
            jax_engine.start(engine.rank(), engine.size(), broadcast)
        pin_tensorflow_gpu(engine.local_rank(), engine.local_size())

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        with jax_engine.alone():
            yield

    def per_worker_step(self, model: keras.Model) -> None:
        if jax_engine.joined():
            jax_engine.per_worker(model)

    def carry(self, optimizer: keras.optimizers.Optimizer, variables: list) -> None:
        from toolkit.backends import jax_state

        jax_state.carry(optimizer, variables)

    def carried(self, optimizer: keras.optimizers.Optimizer) -> list:
        from toolkit.backends import jax_state

        return jax_state.carried(optimizer)

    def assign_own(self, variable: keras.Variable, value: np.ndarray) -> None:
        """Several workers: ``variable`` takes a global value whose every device holds this
        worker's, built from the devices' own buffers, where an assignment of a host value
        would first check that every worker assigns the same."""
        if not jax_engine.joined():
            return super().assign_own(variable, value)
        variable.assign(jax_engine.own(value, variable.value.sharding))

    def allreduce_mean(self, engine: Any, tensors: list, compression: Any = None) -> list:
        if compression is None:
            return jax_engine.mean(tensors)
        sent = [compression.compress(t) for t in tensors]
        means = jax_engine.mean([t for t, _ in sent])
        return [compression.decompress(m, c) for m, (_, c) in zip(means, sent, strict=True)]

    def allgather(self, engine: Any, tensors: list) -> list:
        return jax_engine.gather(tensors)

    def allreduce_min(self, engine: Any, tensor: Any) -> Any:
        return jax_engine.minimum(tensor)

    def when(self, condition: Any, action: Callable[[], None]) -> None:
        """In a compiled step, ``action`` writes what it writes wherever ``condition`` holds
        and leaves the values it found elsewhere (its collectives run on every update);
        eagerly, it runs where ``condition`` holds."""
        from toolkit.backends import jax_state

        if not jax_state.when(condition, action):
            super().when(condition, action)

    def state_dtype(self) -> str:
        """``float64`` only with ``jax_enable_x64``; ``float32`` otherwise (JAX has no float64)."""
        import jax

        return "float64" if jax.config.jax_enable_x64 else "float32"

    def compiled(self, function: Callable) -> Callable:
        import jax

        return jax.jit(function)

    def compiled_stateful(self, function: Callable) -> Callable:
        """``function`` as it is: a jitted function holds the variables' values it was traced
        with, and its writes to them would hold traced values."""
        return function

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
