"""Keras 3 optimizers for large-batch training, and a registry of them by name.

``get("lars", learning_rate=0.1, ...)`` builds the toolkit's :class:`SGD`, :class:`LARS` or
:class:`LBSGD`, or one of Keras's built-ins (``adam``, ``adamw``, ``rmsprop``, ``adagrad``,
``lamb``, ``keras_sgd``). Note that ``"sgd"`` is the toolkit's PyTorch-semantics SGD.
"""

from __future__ import annotations

import keras

from toolkit.catalog import OPTIMIZERS
from toolkit.optimizers.base import unwrapped
from toolkit.optimizers.lars import LARS
from toolkit.optimizers.lbsgd import LBSGD
from toolkit.optimizers.sgd import SGD
from toolkit.optimizers.trust_ratio import trust_ratio


def get(name: str, **params) -> keras.optimizers.Optimizer:
    """Build the optimizer registered as ``name`` with ``params`` (errors list what is allowed)."""
    return OPTIMIZERS.get(name, **params)


def applies_trust_ratios(optimizer: keras.optimizers.Optimizer) -> bool:
    """Whether ``optimizer`` (or the one a ``LossScaleOptimizer`` wraps) applies per-layer trust
    ratios, which a run then logs: asked of the optimizer (its ``applies_trust_ratios``, as LARS
    and LBSGD's ``lars`` warmup say), never of its name, so any optimizer added to the catalog
    that has them gets their logging too."""
    return bool(getattr(unwrapped(optimizer), "applies_trust_ratios", False))


def accumulates_batches(optimizer: keras.optimizers.Optimizer) -> int | None:
    """How many batches ``optimizer`` (or the one a ``LossScaleOptimizer`` wraps) sums itself
    per update (LBSGD's ``batch_scale``); ``None`` if it leaves accumulation to the trainer.
    Asked of the optimizer, as :func:`toolkit.optimizer_rules.accumulated_batches` asks the
    catalog of a config's."""
    return getattr(unwrapped(optimizer), "accumulates_batches", None)


def rate_multiplier(optimizer: keras.optimizers.Optimizer, calls):
    """The factor ``optimizer`` puts on its scheduled rate itself after ``calls`` calls
    (LBSGD's warm-up; 1 for Keras's own optimizers)."""
    own = getattr(unwrapped(optimizer), "rate_multiplier", None)
    return 1.0 if own is None else own(calls)


__all__ = [
    "LARS",
    "LBSGD",
    "OPTIMIZERS",
    "SGD",
    "accumulates_batches",
    "applies_trust_ratios",
    "get",
    "rate_multiplier",
    "trust_ratio",
    "unwrapped",
]
