"""Stochastic gradient descent with PyTorch / Apache SINGA semantics."""

from __future__ import annotations

import keras
from keras import ops

from toolkit.optimizer_rules import check_sgd, non_negative
from toolkit.optimizers.base import CoupledDecayOptimizer, Hyperparameter
from toolkit.optimizers.kernels import buffered_momentum, coupled


@keras.saving.register_keras_serializable(package="toolkit")
class SGD(CoupledDecayOptimizer):
    """SGD with momentum, dampening, Nesterov and coupled L2 weight decay, as ``torch.optim.SGD``.

    Update rule, per variable ``w`` with gradient ``g`` and buffer ``buf``::

        g = g + weight_decay * w
        if momentum != 0:
            buf = g                                        # first step
            buf = momentum * buf + (1 - dampening) * g     # later steps
            g = g + momentum * buf if nesterov else buf
        w = w - learning_rate * g

    This differs from ``keras.optimizers.SGD`` (which keeps ``v = m*v - lr*g``): here the
    learning rate multiplies the buffer at use, so changing the rate rescales the whole step
    at once. ``momentum``, ``dampening`` and ``weight_decay`` may be schedules.

    Args:
        learning_rate: float or schedule.
        momentum: momentum factor, >= 0.
        dampening: dampening of the gradient added to the buffer (not applied on the first step).
        nesterov: Nesterov momentum; needs ``momentum > 0`` and ``dampening == 0``.
        weight_decay: coupled L2 coefficient, >= 0.
        **kwargs: Keras optimizer arguments (``clipnorm``, ``loss_scale_factor``, ...).
    """

    _hyperparameters = ("momentum", "dampening", "weight_decay")

    def __init__(
        self,
        learning_rate: Hyperparameter = 0.01,
        momentum: Hyperparameter = 0.0,
        dampening: Hyperparameter = 0.0,
        nesterov: bool = False,
        weight_decay: Hyperparameter = 0.0,
        name: str = "SGD",
        **kwargs,
    ):
        super().__init__(learning_rate, momentum, weight_decay, name, **kwargs)
        self.dampening = non_negative("dampening", dampening)
        self.nesterov = bool(nesterov)
        check_sgd(self.momentum, self.dampening, self.nesterov)

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        learning_rate = ops.cast(learning_rate, dtype)
        gradient = ops.cast(gradient, dtype)
        weight_decay = self._decay_now(dtype)
        if not self.uses_momentum:
            self.assign_sub(variable, learning_rate * coupled(gradient, variable, weight_decay))
            return
        if self._dampens:
            gradient = self._dampening_weight(dtype) * coupled(gradient, variable, weight_decay)
            weight_decay = 0.0
        buffer = self.velocities[self._get_variable_index(variable)]
        momentum = self._hyper(self.momentum, dtype)
        buffered_momentum(
            variable, buffer, learning_rate, gradient, momentum, self.nesterov, weight_decay
        )

    def _update_all(self, update, learning_rate):
        """:meth:`update_step`'s rule on every variable at once: PyTorch's fused SGD kernel."""
        from toolkit.optimizers import multi_tensor

        dtype = update.variables[0].dtype
        multi_tensor.buffered_momentum(
            update.weights,
            self._velocities(update),
            learning_rate,
            update.gradients,
            momentum=self._number(self.momentum, dtype) if self.uses_momentum else 0.0,
            nesterov=self.nesterov,
            weight_decay=self._number(self.weight_decay, dtype),
            dampening=self._number(self.dampening, dtype),
            first_step=self._dampens and int(self.iterations) == 0,
        )

    @property
    def _dampens(self) -> bool:
        return callable(self.dampening) or self.dampening != 0.0

    def _dampening_weight(self, dtype):
        """The weight of the gradient added to the buffer: ``1 - dampening``, but 1 on the
        first step (the buffer starts at zero, so ``momentum * buf + g`` is ``buf = g`` there;
        Nesterov, which uses the undampened gradient, requires dampening == 0)."""
        first = ops.equal(self.iterations, 0)
        weight = ops.where(first, 1.0, 1.0 - self._hyper(self.dampening, dtype))
        return ops.cast(weight, dtype)

    def get_config(self):
        return {**super().get_config(), "nesterov": self.nesterov}
