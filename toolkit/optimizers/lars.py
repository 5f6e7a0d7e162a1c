"""LARS: layer-wise adaptive rate scaling (You, Gitman and Ginsburg 2017)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import keras
from keras import ops

from toolkit.optimizer_rules import check_lars
from toolkit.optimizers.base import CoupledDecayOptimizer, Hyperparameter
from toolkit.optimizers.trust_ratio import AppliedRatios, RatioRule, layer_trust_ratio


@keras.saving.register_keras_serializable(package="toolkit")
class LARS(CoupledDecayOptimizer):
    """Momentum SGD whose rate is scaled per variable by a trust ratio.

    Update rule, per variable ``w`` with gradient ``g`` and velocity ``v``::

        local = trust_coefficient * ||w|| / (||g|| + weight_decay * ||w|| + epsilon)
        local = 1                          if ||w|| == 0 or ||g|| == 0
        rate = lr * local                  # clip=True (NVIDIA LARC): min(lr * local, lr)
        v = momentum * v + rate * (g + weight_decay * w)
        w = w - v                          # Nesterov: w = w - (momentum * v + rate * (...))

    The velocity slot (``velocities``, and checkpoints) stores ``-v``, as Keras's SGD does.

    Variables excluded from layer adaptation get plain momentum SGD without weight decay
    (``local = 1``, ``weight_decay = 0``). By default those are the variables with at most one
    dimension (biases, normalisation scales and offsets); pass ``exclude_from_layer_adaptation``
    as a list of regular expressions searched in each variable's ``path`` (e.g. ``["bias",
    "batch_norm"]``) to choose instead, or ``[]`` to adapt every variable.

    Args:
        learning_rate: float or schedule (the global rate ``lr``).
        momentum: float or schedule, >= 0.
        weight_decay: coupled L2 coefficient, float or schedule, >= 0.
        trust_coefficient: ``eta`` of the paper, > 0.
        epsilon: added to the ratio's denominator, >= 0.
        nesterov: Nesterov momentum.
        exclude_from_layer_adaptation: ``None`` (exclude 1-D variables) or regex patterns.
        clip: LARC clipping of the adapted rate to at most ``lr``.
        **kwargs: Keras optimizer arguments.
    """

    def __init__(
        self,
        learning_rate: Hyperparameter = 0.1,
        momentum: Hyperparameter = 0.9,
        weight_decay: Hyperparameter = 0.0,
        trust_coefficient: float = 0.001,
        epsilon: float = 0.0,
        nesterov: bool = False,
        exclude_from_layer_adaptation: Sequence[str] | None = None,
        clip: bool = False,
        name: str = "LARS",
        **kwargs,
    ):
        super().__init__(learning_rate, momentum, weight_decay, name, **kwargs)
        check_lars(trust_coefficient, epsilon)
        self.trust_coefficient = float(trust_coefficient)
        self.epsilon = float(epsilon)
        self.nesterov = bool(nesterov)
        self.exclude_from_layer_adaptation = (
            None if exclude_from_layer_adaptation is None else list(exclude_from_layer_adaptation)
        )
        self.clip = bool(clip)

    applies_trust_ratios = True

    def is_adapted(self, variable) -> bool:
        """Whether ``variable`` gets the trust ratio (and weight decay)."""
        if self.exclude_from_layer_adaptation is None:
            return len(variable.shape) > 1
        return not any(re.search(p, variable.path) for p in self.exclude_from_layer_adaptation)

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        # `update_step` may receive backend variables without a `path`; decide once here.
        self._adapted = [self.is_adapted(v) for v in variables]
        adapted = [i for i, is_adapted in enumerate(self._adapted) if is_adapted]
        self._applied_ratios = AppliedRatios(self, variables, adapted)

    def trust_ratio_tensors(self, gradients, variables) -> dict:
        """The per-variable ``local`` ratios an update with ``gradients`` would use, keyed by
        variable path (adapted variables only), as scalar tensors (see :meth:`trust_ratios`),
        computed as the update computes them."""
        pairs = [(g, v) for g, v in zip(gradients, variables, strict=True) if self.is_adapted(v)]
        if not pairs:
            return {}
        gradients, variables = zip(*pairs, strict=True)
        local = self._ratios_as_updated(gradients, variables, self._ratio_rule, self._local_rate)
        return {v.path: ratio for v, ratio in zip(variables, local, strict=True)}

    @property
    def _ratio_rule(self) -> RatioRule:
        """How ``local`` is read from the norms."""
        return RatioRule(
            epsilon=self.epsilon, coefficient=self.trust_coefficient, unit_at_zero=True
        )

    def _local_rate(self, gradient, variable, grad_norm=None):
        weight_decay = self._hyper(self.weight_decay, variable.dtype)
        return layer_trust_ratio(
            variable, gradient, weight_decay, self._ratio_rule, grad_norm=grad_norm
        )

    def update_step(self, gradient, variable, learning_rate):
        learning_rate = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        index = self._get_variable_index(variable)
        if not self._adapted[index]:
            self._heavy_ball_step(variable, learning_rate, gradient, self.nesterov, decay=False)
            return
        local = self._local_rate(gradient, variable, self._gradient_norm(variable))
        self._applied_ratios.record(index, local)
        rate = learning_rate * local
        if self.clip:
            rate = ops.minimum(rate, learning_rate)
        self._heavy_ball_step(variable, rate, gradient, self.nesterov)

    def _update_all(self, update, learning_rate):
        """:meth:`update_step`'s rule on every variable at once (PyTorch, multi-tensor): the
        excluded variables in one heavy-ball step at ``lr``, the adapted ones in another at
        their rates, their trust ratios from one vector."""
        adapted = [self._adapted[i] for i in update.indices]
        excluded = update.part([not a for a in adapted])
        if len(excluded):
            self._heavy_ball_all(excluded, learning_rate, self.nesterov, decay=False)
        update = update.part(adapted)
        if not len(update):
            return
        local = self._trust_ratios_all(update, self._ratio_rule)
        self._applied_ratios.record_all(update.indices, local)
        rates = learning_rate * local
        if self.clip:
            rates = ops.minimum(rates, learning_rate)
        self._heavy_ball_all(update, rates.tolist(), self.nesterov)

    def get_config(self):
        return {
            **super().get_config(),
            "trust_coefficient": self.trust_coefficient,
            "epsilon": self.epsilon,
            "nesterov": self.nesterov,
            "exclude_from_layer_adaptation": self.exclude_from_layer_adaptation,
            "clip": self.clip,
        }
