"""Keras 3 optimizers for large-batch training, and a registry of them by name.

``get("lars", learning_rate=0.1, ...)`` builds the toolkit's :class:`SGD`, :class:`LARS` or
:class:`LBSGD`, or one of Keras's built-ins (``adam``, ``adamw``, ``rmsprop``, ``adagrad``,
``lamb``, ``keras_sgd``). Note that ``"sgd"`` is the toolkit's PyTorch-semantics SGD.
"""

from __future__ import annotations

import keras

from toolkit.catalog import OPTIMIZERS
from toolkit.optimizers.lars import LARS
from toolkit.optimizers.lbsgd import LBSGD
from toolkit.optimizers.sgd import SGD
from toolkit.optimizers.trust_ratio import trust_ratio


def get(name: str, **params) -> keras.optimizers.Optimizer:
    """Build the optimizer registered as ``name`` with ``params`` (errors list what is allowed)."""
    return OPTIMIZERS.get(name, **params)


def unwrapped(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """The optimizer a ``LossScaleOptimizer`` (mixed precision) wraps, or ``optimizer``."""
    return getattr(optimizer, "inner_optimizer", optimizer)


__all__ = ["LARS", "LBSGD", "OPTIMIZERS", "SGD", "get", "trust_ratio", "unwrapped"]
