"""The layer-wise trust ratio shared by LARS and LBSGD's ``lars`` warmup."""

from __future__ import annotations

import keras
from keras import ops


def l2_norm(x):
    """Euclidean norm of a whole tensor.

    Keras has no fused squared norm, and ``sqrt(sum(square(x)))`` writes and re-reads a
    temporary as large as ``x``; on TensorFlow ``tf.nn.l2_loss`` (``sum(x**2) / 2``) reads ``x``
    once, which halves the cost of LARS's norms (experiments/bench_optimizers.py). Every other
    backend gets the ``keras.ops`` form.
    """
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return ops.sqrt(2.0 * tf.nn.l2_loss(x))
    return ops.sqrt(ops.sum(ops.square(x)))


def trust_ratio(weight_norm, grad_norm, weight_decay, *, power: int = 1, epsilon=0.0):
    """``||w|| / (||g||**p + wd * ||w||**p + eps) ** (1/p)``.

    ``power=1`` is You et al.'s LARS ratio ``||w|| / (||g|| + wd*||w|| + eps)`` (before the
    trust coefficient); ``power=2`` is MXNet LBSGD's ``sqrt(||w||^2 / (||g||^2 + wd*||w||^2 +
    eps))``. Callers decide what happens at zero norms and whether to clip.
    """
    if power == 1:
        return weight_norm / (grad_norm + weight_decay * weight_norm + epsilon)
    if power == 2:
        return weight_norm / ops.sqrt(
            ops.square(grad_norm) + weight_decay * ops.square(weight_norm) + epsilon
        )
    raise ValueError(f"trust_ratio power must be 1 or 2, got {power}")
