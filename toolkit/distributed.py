"""Horovod for Keras 3: the thin glue over ``horovod.tensorflow`` ops.

Horovod's own ``horovod.tensorflow.keras`` targets Keras 2. This module gives the same recipe
(init, wrap the optimizer, broadcast the initial state, average metrics, side effects on rank 0)
for Keras 3 on the TensorFlow backend. With one process and no ``horovodrun`` everything works
unchanged: ``size() == 1`` and no collective op is added.

Where the allreduce sits: Keras's ``Optimizer.apply`` ends in ``_backend_apply_gradients``,
which calls ``_clip_gradients(grads)`` right before the update, once per update (with Keras's
``gradient_accumulation_steps`` only on the step that applies the accumulated mean). The
wrapper overrides exactly that hook: ``grouped_allreduce`` (average) of all gradients in one
fused collective, then the wrapped optimizer's own clipping and update. So local accumulation
over N steps costs one allreduce per N steps, and every optimizer (the toolkit's and Keras's)
is wrapped the same way. Under mixed precision the loss-scale optimizer's finite-gradient check
is made global (a ``Min`` allreduce), so all workers skip or apply the same steps.

Horovod's ops cannot run inside an XLA cluster on CPU: compile with ``jit_compile=False``.
"""

from __future__ import annotations

import keras
import tensorflow as tf

import horovod.tensorflow as hvd

COMPRESSIONS = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}


def init() -> None:
    """Start Horovod (idempotent) and, on GPU machines, pin one GPU per local rank."""
    if not hvd.is_initialized():
        hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")


def rank() -> int:
    init()
    return hvd.rank()


def size() -> int:
    init()
    return hvd.size()


def local_rank() -> int:
    init()
    return hvd.local_rank()


def is_rank0() -> bool:
    """Whether this process does the run's side effects (files, progress output)."""
    return rank() == 0


def broadcast_object(value, root_rank: int = 0):
    """``value`` as rank ``root_rank`` has it (any picklable object)."""
    return hvd.broadcast_object(value, root_rank) if size() > 1 else value


def allreduce_mean(value: float, name: str) -> float:
    """The mean of a Python number over all workers (``name`` must match across workers)."""
    if size() == 1:
        return float(value)
    averaged = hvd.allreduce(tf.constant(value, tf.float64), op=hvd.Average, name=name)
    return float(averaged.numpy())


def DistributedOptimizer(  # noqa: N802  (named like Horovod's wrapper, which it replaces)
    optimizer: keras.optimizers.Optimizer,
    *,
    compression: str = "none",
    backward_passes_per_step: int = 1,
) -> keras.optimizers.Optimizer:
    """An optimizer like ``optimizer`` whose gradients are averaged over all workers.

    ``backward_passes_per_step=N`` accumulates N local gradients (Keras's
    ``gradient_accumulation_steps``) and allreduces their mean once. ``compression="fp16"``
    halves the allreduce's bytes. The result is a fresh, unbuilt optimizer of a subclass of
    ``type(optimizer)`` (named like it, so configs and saved models name the original class).
    """
    if compression not in COMPRESSIONS:
        raise ValueError(
            f"compression must be one of {sorted(COMPRESSIONS)}, got {compression!r}"
        )
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        inner = DistributedOptimizer(
            optimizer.inner_optimizer,
            compression=compression,
            backward_passes_per_step=backward_passes_per_step,
        )
        cls = _subclass(
            keras.optimizers.LossScaleOptimizer, check_finite=_global_check_finite
        )
        return cls(
            inner,
            initial_scale=float(optimizer.dynamic_scale.numpy()),
            dynamic_growth_steps=optimizer.dynamic_growth_steps,
        )
    config = optimizer.get_config()
    if backward_passes_per_step > 1:
        if config.get("gradient_accumulation_steps") or "batch_scale" in config:
            raise ValueError(
                f"{type(optimizer).__name__} accumulates gradients itself; "
                "use its own setting (batch_scale / gradient_accumulation_steps) instead"
            )
        config["gradient_accumulation_steps"] = backward_passes_per_step
    if size() == 1:
        return type(optimizer).from_config(config)
    cls = _subclass(
        type(optimizer),
        _clip_gradients=_allreduce_then_clip,
        _compression=COMPRESSIONS[compression],
    )
    return cls.from_config(config)


def _subclass(base: type, **members) -> type:
    cls = type(base.__name__, (base,), members)
    cls.__module__, cls.__qualname__ = base.__module__, base.__qualname__
    return cls


def _allreduce_then_clip(self, grads):
    grads = [
        tf.convert_to_tensor(g) for g in grads
    ]  # IndexedSlices (Embedding) -> dense
    grads = hvd.grouped_allreduce(grads, op=hvd.Average, compression=self._compression)
    return super(type(self), self)._clip_gradients(grads)


def _global_check_finite(self, grads):
    finite = super(type(self), self).check_finite(grads)
    everywhere = hvd.allreduce(
        tf.cast(finite, tf.float32), op=hvd.Min, name="finite_grads"
    )
    return everywhere > 0.5


def broadcast_variables(model: keras.Model, optimizer=None, root_rank: int = 0) -> None:
    """Make every worker's model (and optimizer state) equal to rank ``root_rank``'s."""
    if size() == 1:
        return
    variables = list(model.variables)
    if optimizer is not None:
        optimizer.build(model.trainable_variables)
        variables += list(optimizer.variables)
    hvd.broadcast_variables([v.value for v in variables], root_rank=root_rank)


class BroadcastInitialState(keras.callbacks.Callback):
    """At the start of ``fit``, broadcast model weights and optimizer state from rank 0 (so
    workers started with different seeds, or a resumed rank 0, agree)."""

    def on_train_begin(self, logs=None):
        broadcast_variables(self.model, self.model.optimizer)


class MetricAverageCallback(keras.callbacks.Callback):
    """Replace each epoch-end metric with its mean over workers (in place, so callbacks after
    this one, such as the event logger, see global values)."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or size() == 1:
            return
        for key in sorted(logs):
            logs[key] = allreduce_mean(float(logs[key]), name=f"metric.{key}.{epoch}")
