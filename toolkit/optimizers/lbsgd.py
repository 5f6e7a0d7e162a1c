"""LBSGD: large-batch SGD with warmup and macro-batch accumulation (Apache MXNet PR #8918)."""

from __future__ import annotations

import keras
from keras import ops

from toolkit.optimizer_rules import check_lbsgd
from toolkit.optimizers.base import CoupledDecayOptimizer, Hyperparameter
from toolkit.optimizers.schedules import warmup_ramp
from toolkit.optimizers.trust_ratio import AppliedRatios, RatioRule, layer_trust_ratio


@keras.saving.register_keras_serializable(package="toolkit")
class LBSGD(CoupledDecayOptimizer):
    """MXNet's large-batch SGD: emulate a ``batch_scale`` times larger batch and warm up to it.

    Gradients are accumulated over ``batch_scale`` calls; every ``batch_scale``-th call applies
    their mean ``g`` (variables do not move in between). With ``n`` the number of calls so far
    counted from ``begin_epoch * updates_per_epoch`` (1 on the first call) and
    ``N = warmup_epochs * updates_per_epoch``, the learning rate is multiplied by::

        mult = batch_scale                                 if n >= N (or N <= 1)
        mult = 1 + (batch_scale - 1) * r(n / N)            r = p, p**2, sqrt(p) for
                                                           linear, power2, sqrt
        mult = clip(sqrt(||w||^2 / (||g||^2 + wd * ||w||^2 + 1e-18)), 0.01, 100)
                                                           for warmup_strategy="lars"

    and the update is MXNet's ``sgd_mom_update``::

        v = momentum * v + lr * mult * (g + weight_decay * w)
        w = w - v

    (the velocity slot and checkpoints store ``-v``, as Keras's SGD does)

    Accumulation reuses Keras's ``gradient_accumulation_steps`` (set to ``batch_scale``), so the
    learning-rate schedule sees every call, like MXNet's, and ``iterations`` counts applied
    updates. ``begin_epoch`` moves the warmup position only; updates happen on every
    ``batch_scale``-th call of this optimizer.

    Args:
        learning_rate: float or schedule.
        momentum: float or schedule, >= 0.
        weight_decay: coupled L2 coefficient, float or schedule, >= 0.
        warmup_strategy: one of ``linear``, ``power2``, ``sqrt``, ``lars``.
        warmup_epochs: length of the warmup in epochs, >= 0.
        updates_per_epoch: calls per epoch, >= 1 (MXNet's default 32 rarely matches a real run).
        batch_scale: calls accumulated per update, >= 1.
        begin_epoch: epoch the run starts at (for resuming mid-warmup), >= 0.
        **kwargs: Keras optimizer arguments, except ``gradient_accumulation_steps``.
    """

    def __init__(
        self,
        learning_rate: Hyperparameter = 0.01,
        momentum: Hyperparameter = 0.0,
        weight_decay: Hyperparameter = 0.0,
        warmup_strategy: str = "linear",
        warmup_epochs: int = 5,
        updates_per_epoch: int = 32,
        batch_scale: int = 1,
        begin_epoch: int = 0,
        name: str = "LBSGD",
        **kwargs,
    ):
        check_lbsgd(
            warmup_strategy,
            warmup_epochs,
            updates_per_epoch,
            batch_scale,
            begin_epoch,
            kwargs.pop("gradient_accumulation_steps", None),
        )
        super().__init__(
            learning_rate,
            momentum,
            weight_decay,
            name,
            gradient_accumulation_steps=int(batch_scale) if batch_scale > 1 else None,
            **kwargs,
        )
        self.warmup_strategy = warmup_strategy
        self.warmup_epochs = int(warmup_epochs)
        self.updates_per_epoch = int(updates_per_epoch)
        self.batch_scale = int(batch_scale)
        self.begin_epoch = int(begin_epoch)

    @property
    def accumulates_batches(self) -> int:
        """The batches it sums itself per update: ``batch_scale`` (whatever the trainer's own
        accumulation would be, it must stay 1)."""
        return self.batch_scale

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        if self.warmup_strategy == "lars":
            self._applied_ratios = AppliedRatios(self, variables, range(len(variables)))

    def warmup_multiplier(self, calls):
        """``mult`` of the linear/power2/sqrt strategies after ``calls`` calls (1-based)."""
        n = ops.cast(calls + self.begin_epoch * self.updates_per_epoch, "float32")
        total = self.warmup_epochs * self.updates_per_epoch
        if total <= 1:
            return ops.cast(self.batch_scale, "float32")
        ramp = warmup_ramp(self.warmup_strategy, ops.minimum(n / total, 1.0))
        return 1.0 + (self.batch_scale - 1.0) * ramp

    def rate_multiplier(self, calls):
        """The factor it puts on its learning rate itself after ``calls`` calls (1-based):
        :meth:`warmup_multiplier`; 1 with the ``lars`` warm-up, which is per layer."""
        return 1.0 if self.warmup_strategy == "lars" else self.warmup_multiplier(calls)

    @property
    def applies_trust_ratios(self) -> bool:
        return self.warmup_strategy == "lars"

    _LARS_WARMUP = RatioRule(power=2, epsilon=1e-18, bounds=(0.01, 100.0))
    """The ``lars`` strategy's trust ratio: MXNet's ``sqrt(||w||^2 / (||g||^2 + wd * ||w||^2 +
    1e-18))``, clipped to [0.01, 100]."""

    def _lars_multiplier(self, gradient, variable, grad_norm=None):
        weight_decay = self._hyper(self.weight_decay, variable.dtype)
        return layer_trust_ratio(
            variable, gradient, weight_decay, self._LARS_WARMUP, grad_norm=grad_norm
        )

    def trust_ratio_tensors(self, gradients, variables) -> dict:
        """The ``lars`` strategy's per-variable multipliers for ``gradients``, keyed by variable
        path, as scalar tensors (see :meth:`trust_ratios`)."""
        if self.warmup_strategy != "lars":
            raise ValueError("trust ratios exist only with warmup_strategy='lars'")
        multipliers = self._ratios_as_updated(
            gradients, variables, self._LARS_WARMUP, self._lars_multiplier
        )
        return {v.path: m for v, m in zip(variables, multipliers, strict=True)}

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        gradient = ops.cast(gradient, dtype)
        if self.warmup_strategy == "lars":
            multiplier = self._lars_multiplier(gradient, variable, self._gradient_norm(variable))
            self._applied_ratios.record(self._get_variable_index(variable), multiplier)
        else:
            multiplier = ops.cast(self.warmup_multiplier(self._iterations + 1), dtype)
        rate = ops.cast(learning_rate, dtype) * multiplier
        self._heavy_ball_step(variable, rate, gradient)

    def _update_all(self, update, learning_rate):
        """:meth:`update_step`'s rule on every variable at once (PyTorch, multi-tensor): the
        ``lars`` multipliers from one vector."""
        if self.warmup_strategy == "lars":
            multipliers = self._trust_ratios_all(update, self._LARS_WARMUP)
            self._applied_ratios.record_all(update.indices, multipliers)
            rates = (learning_rate * multipliers).tolist()
        else:
            multiplier = self.warmup_multiplier(self._iterations + 1)
            rates = learning_rate * ops.cast(multiplier, learning_rate.dtype)
        self._heavy_ball_all(update, rates)

    def get_config(self):
        config = super().get_config()
        del config["gradient_accumulation_steps"]
        return {
            **config,
            "warmup_strategy": self.warmup_strategy,
            "warmup_epochs": self.warmup_epochs,
            "updates_per_epoch": self.updates_per_epoch,
            "batch_scale": self.batch_scale,
            "begin_epoch": self.begin_epoch,
        }
