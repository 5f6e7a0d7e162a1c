"""The two memory-bound kernels of the SGD family, fused where the backend has them.

An optimizer update is limited by memory traffic, not arithmetic. Written with ``keras.ops``
every elementwise operation is its own pass over the tensor; TensorFlow has single-pass kernels
for both pieces the toolkit needs, so on that backend they are used, and every other backend
gets the ``keras.ops`` form (same results to float32 round-off; the oracle tests run on both).
``experiments/bench_optimizers.py`` measures the difference.
"""

from __future__ import annotations

import keras
from keras import ops


def _tensorflow():
    if keras.backend.backend() != "tensorflow":
        return None
    import tensorflow as tf

    return tf


def l2_norm(x):
    """Euclidean norm of a whole tensor: ``sqrt(sum(x**2))`` (TensorFlow: ``tf.nn.l2_loss``,
    one read of ``x`` and no temporary)."""
    tf = _tensorflow()
    if tf is not None:
        return ops.sqrt(2.0 * tf.nn.l2_loss(x))
    return ops.sqrt(ops.sum(ops.square(x)))


def heavy_ball(variable, velocity, learning_rate, gradient, momentum, nesterov: bool) -> None:
    """``v = momentum * v - lr * g; w += v`` (Nesterov: ``w += momentum * v - lr * g``).

    The velocity is stored negated, as in Keras's SGD, which is what TensorFlow's fused
    ``ResourceApplyKerasMomentum`` kernel keeps: one pass reads ``w``, ``v`` and ``g``.
    """
    tf = _tensorflow()
    if tf is not None:
        _fused(
            tf.raw_ops.ResourceApplyKerasMomentum,
            variable,
            velocity,
            learning_rate,
            gradient,
            momentum,
            nesterov,
        )
        return
    step = learning_rate * gradient
    new_velocity = momentum * velocity - step
    velocity.assign(new_velocity)
    variable.assign_add(momentum * new_velocity - step if nesterov else new_velocity)


def buffered_momentum(variable, buffer, learning_rate, gradient, momentum, nesterov: bool) -> None:
    """PyTorch's momentum without dampening: ``buf = momentum * buf + g``, then
    ``w -= lr * buf`` (Nesterov: ``w -= lr * (g + momentum * buf)``); TensorFlow's fused
    ``ResourceApplyMomentum`` is exactly this."""
    tf = _tensorflow()
    if tf is not None:
        _fused(
            tf.raw_ops.ResourceApplyMomentum,
            variable,
            buffer,
            learning_rate,
            gradient,
            momentum,
            nesterov,
        )
        return
    new_buffer = momentum * buffer + gradient
    buffer.assign(new_buffer)
    variable.assign_sub(
        learning_rate * (gradient + momentum * new_buffer if nesterov else new_buffer)
    )


def _fused(kernel, variable, slot, learning_rate, gradient, momentum, nesterov: bool) -> None:
    kernel(
        var=variable.handle,
        accum=slot.handle,
        lr=ops.cast(learning_rate, variable.dtype),
        grad=gradient,
        momentum=ops.cast(momentum, variable.dtype),
        use_nesterov=nesterov,
    )
