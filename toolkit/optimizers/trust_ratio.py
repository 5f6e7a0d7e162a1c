"""The layer-wise trust ratio shared by LARS and LBSGD's ``lars`` warmup."""

from __future__ import annotations

from keras import ops


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
