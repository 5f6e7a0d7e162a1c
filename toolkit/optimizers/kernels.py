"""The memory-bound kernels of the SGD family, fused where the backend has them.

An optimizer update is limited by memory traffic, not arithmetic: every elementwise operation
written with ``keras.ops`` is its own pass over the tensor. On TensorFlow the momentum steps run
as single-pass kernels:

* on CPU, the toolkit's own ``fused_kernels.cc`` (built by ``scripts/setup.sh`` into
  ``fused_kernels.so``), which also folds in the coupled weight decay ``g + wd * w``: one read
  of ``w``, the slot and ``g``, one write of ``w`` and the slot (its ``TrustRatio`` serves
  :func:`toolkit.optimizers.trust_ratio.layer_trust_ratio`);
* elsewhere (a GPU or float16 variable, or the library not built), TensorFlow's
  ``ResourceApplyKerasMomentum`` and ``ResourceApplyMomentum``, after a separate ``g + wd * w``.

Every other backend gets the ``keras.ops`` form. The momentum steps do the same float
operations in the same order on all three paths (the fused and unfused TensorFlow ones agree bit
for bit); the fused trust ratio adds its sums in double, so it may differ from the unfused one
in the last bits. ``experiments/bench_optimizers.py`` measures the difference.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

from keras import ops

from toolkit import backends

FUSED_LIBRARY = Path(__file__).with_name("fused_kernels.so")


@functools.cache
def _tensorflow():
    """TensorFlow, where the backend's variables are TensorFlow's; else ``None``."""
    if not backends.current().tensorflow_kernels:
        return None
    import tensorflow as tf

    return tf


@functools.cache
def fused_ops():
    """The loaded ``fused_kernels.so`` (TensorFlow backend), or ``None`` when it is not built
    or does not load (a warning then says how to rebuild it)."""
    tf = _tensorflow()
    if tf is None or not FUSED_LIBRARY.exists():
        return None
    try:
        return tf.load_op_library(str(FUSED_LIBRARY))
    except (tf.errors.NotFoundError, OSError) as error:
        warnings.warn(
            f"{FUSED_LIBRARY.name} does not load ({error}); momentum steps use TensorFlow's "
            "unfused kernels. Rebuild it with scripts/setup.sh.",
            stacklevel=2,
        )
        return None


def fused_kernels_for(variable):
    """The fused library when ``variable`` is float32 or float64 on a CPU, else ``None``."""
    library = fused_ops()
    if library is None:
        return None
    tf = _tensorflow()
    on_cpu = tf.DeviceSpec.from_string(variable.handle.device).device_type == "CPU"
    kernel_dtype = tf.as_dtype(variable.dtype) in (tf.float32, tf.float64)
    return library if on_cpu and kernel_dtype else None


def l2_norm(x):
    """Euclidean norm of a whole tensor: ``sqrt(sum(x**2))`` (TensorFlow: ``tf.nn.l2_loss``,
    one read of ``x`` and no temporary)."""
    tf = _tensorflow()
    if tf is not None:
        return ops.sqrt(2.0 * tf.nn.l2_loss(x))
    return ops.sqrt(ops.sum(ops.square(x)))


def coupled(gradient, variable, weight_decay):
    """``g + wd * w``; ``g`` itself when ``wd`` is the Python number 0 (decided at trace
    time)."""
    if isinstance(weight_decay, (int, float)) and weight_decay == 0:
        return gradient
    return gradient + weight_decay * variable


def heavy_ball(
    variable, velocity, learning_rate, gradient, momentum, nesterov: bool, weight_decay=0.0
) -> None:
    """``d = g + wd * w; v = momentum * v - lr * d; w += v`` (Nesterov: ``w += momentum * v -
    lr * d``).

    The velocity is stored negated, as in Keras's SGD and TensorFlow's
    ``ResourceApplyKerasMomentum``.
    """
    step = (variable, velocity, learning_rate, gradient, momentum, nesterov, weight_decay)
    if _tensorflow_step("CoupledKerasMomentum", "ResourceApplyKerasMomentum", *step):
        return
    scaled = learning_rate * coupled(gradient, variable, weight_decay)
    new_velocity = momentum * velocity - scaled
    velocity.assign(new_velocity)
    variable.assign_add(momentum * new_velocity - scaled if nesterov else new_velocity)


def buffered_momentum(
    variable, buffer, learning_rate, gradient, momentum, nesterov: bool, weight_decay=0.0
) -> None:
    """PyTorch's momentum without dampening: ``d = g + wd * w; buf = momentum * buf + d``, then
    ``w -= lr * buf`` (Nesterov: ``w -= lr * (d + momentum * buf)``), which is TensorFlow's
    ``ResourceApplyMomentum`` after the decay."""
    step = (variable, buffer, learning_rate, gradient, momentum, nesterov, weight_decay)
    if _tensorflow_step("CoupledMomentum", "ResourceApplyMomentum", *step):
        return
    gradient = coupled(gradient, variable, weight_decay)
    new_buffer = momentum * buffer + gradient
    buffer.assign(new_buffer)
    variable.assign_sub(
        learning_rate * (gradient + momentum * new_buffer if nesterov else new_buffer)
    )


def _tensorflow_step(
    fused_name,
    tensorflow_name,
    variable,
    slot,
    learning_rate,
    gradient,
    momentum,
    nesterov,
    weight_decay,
) -> bool:
    """Run a momentum step as one kernel: the fused one (decay inside) on a CPU variable, else
    TensorFlow's (decay added first). ``False`` when the backend is not TensorFlow."""
    fused = fused_kernels_for(variable)
    if fused is not None:
        kernel, scalars = getattr(fused, fused_name), {"weight_decay": weight_decay}
    elif (tf := _tensorflow()) is not None:
        kernel, scalars = getattr(tf.raw_ops, tensorflow_name), {}
        gradient = coupled(gradient, variable, weight_decay)
    else:
        return False
    scalars |= {"lr": learning_rate, "momentum": momentum}
    kernel(
        var=variable.handle,
        accum=slot.handle,
        grad=gradient,
        use_nesterov=nesterov,
        **{name: ops.cast(value, variable.dtype) for name, value in scalars.items()},
    )
    return True
