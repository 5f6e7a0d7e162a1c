"""What the toolkit's optimizers share: coupled L2 weight decay, hyperparameters that may be
schedules, the heavy-ball momentum step, a config that round-trips all of it, and the state a
checkpoint keeps."""

from __future__ import annotations

from collections.abc import Callable

import keras
from keras import ops

from toolkit import backends
from toolkit.optimizer_rules import momentum_refusals, non_negative, uses_momentum
from toolkit.optimizers.kernels import coupled, heavy_ball
from toolkit.optimizers.schedules import value_at

Hyperparameter = float | Callable  # a constant, or a schedule called with the optimizer step


def unwrapped(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """The optimizer a ``LossScaleOptimizer`` (mixed precision) wraps, or ``optimizer``."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def state_variables(optimizer: keras.optimizers.Optimizer) -> list:
    """``optimizer.variables`` less what the backend carries among them and is not the
    optimizer's state (on JAX, whose compiled step returns only tracked variables: the trust
    ratios applied last, a traffic counter, the noise meter's norms:
    :meth:`~toolkit.backends.base.Backend.carry`): what a saved model holds (``model.save``),
    the same list on every backend. (A run directory's checkpoint holds
    ``optimizer.variables``, so one written on JAX resumes on JAX.)"""
    carried = backends.current().carried(unwrapped(optimizer))
    return [v for v in optimizer.variables if all(v is not c for c in carried)]


class CoupledDecayOptimizer(keras.optimizers.Optimizer):
    """Base of the toolkit's SGD-family optimizers.

    * ``weight_decay`` is coupled L2 regularisation folded into the gradient by ``update_step``
      (``g + wd * w``), not Keras's decoupled decay, so Keras's own decay step is disabled.
    * ``momentum`` and ``weight_decay`` (and any name in ``_hyperparameters``) may be floats or
      schedules; :meth:`_hyper` reads their value at the current step, the same 0-based step
      Keras passes to a learning-rate schedule.
    * ``get_config``/``from_config`` serialise schedule-valued hyperparameters.
    """

    _hyperparameters: tuple[str, ...] = ("momentum", "weight_decay")
    _applied_ratios = None  # set by LARS and LBSGD's lars warmup: a trust_ratio.AppliedRatios
    applies_trust_ratios = False  # LARS, LBSGD's lars warmup
    accumulates_batches: int | None = None  # LBSGD's batch_scale: batches it sums itself

    def rate_multiplier(self, calls):
        """The factor this optimizer puts on its learning rate itself after ``calls`` calls
        (1-based): none here (LBSGD's warm-up)."""
        return 1.0

    moved_momentum: Hyperparameter | None = None  # see take_momentum
    _gradient_norms = None  # see use_gradient_norms
    _one_dtype = False  # built over variables of one dtype (see build)
    multi_tensor = True
    """On PyTorch, update every variable at once (:meth:`_update_all`, multi-tensor kernels, as
    Keras's own SGD does there); ``False``: Keras's loop of :meth:`update_step` per variable,
    the reference the fast path is tested against. TensorFlow and JAX compile the loop."""

    def __init__(self, learning_rate, momentum, weight_decay, name, **kwargs):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.momentum = non_negative("momentum", momentum)
        self.weight_decay = non_negative("weight_decay", weight_decay)

    def _apply_weight_decay(self, variables):
        """Disabled: the decay is coupled into the gradient by ``update_step``."""

    @property
    def uses_momentum(self) -> bool:
        """Whether a velocity slot is needed (a momentum schedule always needs one)."""
        return uses_momentum(self.momentum)

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self.velocities = (
            self.add_optimizer_variables(variables, "velocity") if self.uses_momentum else []
        )
        self._one_dtype = len({v.dtype for v in variables}) == 1

    def take_momentum(self) -> Hyperparameter:
        """Hand the momentum over to the allreduce (Deep Gradient Compression's momentum
        correction): return it, and apply later updates without momentum (the allreduce sends
        velocities ``u = m * u + g``). Refused (``ValueError``) where that velocity would not be
        this optimizer's: no momentum, Nesterov, dampening, or velocities already built."""
        why = momentum_refusals(
            self.momentum, getattr(self, "nesterov", False), getattr(self, "dampening", 0.0)
        )
        if self.built:
            why.append("an optimizer not built yet")
        if why:
            raise ValueError(f"momentum correction needs {' and '.join(why)}")
        self.moved_momentum, self.momentum = self.momentum, 0.0
        return self.moved_momentum

    def use_gradient_norms(self, norms: list) -> None:
        """Take ``norms`` (one per variable, in order) as the gradients' norms in the next
        update's trust ratios, in place of the norms of the gradients it applies: what the
        allreduce hook gives under sparsification (the dense gradients' norms)."""
        self._gradient_norms = norms

    def _gradient_norm(self, variable):
        """The norm :meth:`use_gradient_norms` gave for ``variable`` (``None``: none given)."""
        if self._gradient_norms is None:
            return None
        return self._gradient_norms[self._get_variable_index(variable)]

    def _given_norms(self, update) -> list | None:
        """The norms :meth:`use_gradient_norms` gave for ``update``'s variables (``None``: none
        given)."""
        if self._gradient_norms is None:
            return None
        return [self._gradient_norms[i] for i in update.indices]

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        """Keras's update of every variable, then the trust ratios it recorded kept at once,
        by updates that apply only: on TensorFlow and PyTorch this runs in Keras's accumulation
        branch alone; JAX runs it on every call and keeps its result where the call applies,
        so the ratios are kept the same way. Gradient norms given for the update are used up
        by it."""
        if self._updates_all_at_once():
            import torch

            from toolkit.optimizers.multi_tensor import Update

            with torch.no_grad():
                update = Update.of(self, grads, trainable_variables)
                self._update_all(update, ops.cast(learning_rate, update.variables[0].dtype))
        else:
            super()._backend_update_step(grads, trainable_variables, learning_rate)
        self._gradient_norms = None
        if self._applied_ratios is not None:
            steps = self.gradient_accumulation_steps
            self._applied_ratios.write((self._iterations + 1) % steps == 0 if steps else True)

    # On PyTorch: every variable at once (toolkit/optimizers/multi_tensor.py)

    def _updates_all_at_once(self) -> bool:
        """Whether updates run :meth:`_update_all`: on PyTorch, with :attr:`multi_tensor`,
        over variables of one dtype, unless a momentum schedule is at 0 now (PyTorch's kernel
        keeps no buffer then, and the velocities must still move)."""
        multi_tensor = self.multi_tensor and backends.current().multi_tensor_updates
        if not (multi_tensor and self._one_dtype):
            return False
        return not (callable(self.momentum) and self._number(self.momentum, "float32") == 0)

    def _update_all(self, update, learning_rate) -> None:
        """:meth:`update_step` on every variable of ``update`` (a
        :class:`~toolkit.optimizers.multi_tensor.Update`) at once, ``learning_rate`` in their
        dtype (each subclass gives its own)."""
        raise NotImplementedError

    def _velocities(self, update) -> list | None:
        """The PyTorch tensors of the velocity slots of ``update``'s variables (``None``: no
        momentum)."""
        if not self.uses_momentum:
            return None
        return [self.velocities[i].value for i in update.indices]

    def _number(self, value: Hyperparameter, dtype) -> float:
        """A hyperparameter at the current step as a Python number (what PyTorch's kernels
        take, rounding it to the tensors' dtype as :meth:`_hyper` does): a constant as it is,
        with no trip to the device; a schedule's value rounded to ``dtype``."""
        return float(self._hyper(value, dtype)) if callable(value) else float(value)

    def _heavy_ball_all(self, update, rates, nesterov=False, decay=True):
        """:meth:`_heavy_ball_step` on every variable of ``update`` at once, with ``rates`` one
        rate or a list of numbers, one per variable."""
        from toolkit.optimizers import multi_tensor

        dtype = update.variables[0].dtype
        multi_tensor.heavy_ball(
            update.weights,
            self._velocities(update),
            rates,
            update.gradients,
            momentum=self._number(self.momentum, dtype) if self.uses_momentum else 0.0,
            nesterov=nesterov,
            weight_decay=self._number(self.weight_decay, dtype) if decay else 0.0,
        )

    def _trust_ratios_all(self, update, rule):
        """The trust ratios by ``rule`` (a :class:`~toolkit.optimizers.trust_ratio.RatioRule`)
        of ``update``'s variables, as one vector."""
        from toolkit.optimizers import multi_tensor

        weight_decay = self._number(self.weight_decay, update.variables[0].dtype)
        norms = self._given_norms(update)
        return multi_tensor.trust_ratios(
            update.weights, update.gradients, weight_decay, rule, norms
        )

    def _ratios_as_updated(self, gradients, variables, rule, per_variable) -> list:
        """The trust ratios by ``rule`` of ``variables`` for ``gradients``, as an update
        computes them: from one vector where it updates every variable at once, else
        ``per_variable(gradient, variable)`` for each."""
        if self._updates_all_at_once():
            from toolkit.optimizers.multi_tensor import Update

            update = Update.of(self, gradients, variables)
            return list(self._trust_ratios_all(update, rule).unbind())
        pairs = zip(gradients, variables, strict=True)
        return [per_variable(ops.cast(g, v.dtype), v) for g, v in pairs]

    def _backend_increment_gradient_accumulators(self, grads, acc_grads):
        """Keras's, by one multi-tensor add on PyTorch (as Keras's own SGD does there)."""
        if not self._updates_all_at_once():
            return super()._backend_increment_gradient_accumulators(grads, acc_grads)
        import torch

        from toolkit.optimizers.multi_tensor import like

        with torch.no_grad():
            accumulators = [a.value for a in acc_grads]
            grads = [like(g, a) for g, a in zip(grads, accumulators, strict=True)]
            torch._foreach_add_(accumulators, grads)

    def _backend_reset_gradient_accumulators(self):
        """Keras's, by one multi-tensor zeroing on PyTorch."""
        if not self._updates_all_at_once():
            return super()._backend_reset_gradient_accumulators()
        import torch

        with torch.no_grad():
            torch._foreach_zero_([a.value for a in self._accumulated_gradients if a is not None])

    def applied_trust_ratios(self) -> dict[str, float]:
        """The trust ratio each variable got in the latest update (NaN before the first),
        keyed by variable path (LARS, LBSGD's ``lars`` warmup): what a run logs, at no cost."""
        if self._applied_ratios is None:
            raise ValueError(f"{self.name} applies no trust ratios (or is not built yet)")
        return self._applied_ratios.read()

    def trust_ratios(self, gradients, variables) -> dict[str, float]:
        """:meth:`trust_ratio_tensors` (defined by LARS and LBSGD) as floats, keyed by variable
        path: eager, for logging, plots and notebooks."""
        ratios = self.trust_ratio_tensors(gradients, variables)
        return {path: float(ops.convert_to_numpy(r)) for path, r in ratios.items()}

    def _hyper(self, value: Hyperparameter, dtype):
        return value_at(value, self._iterations, dtype)

    def _decay_now(self, dtype):
        """``weight_decay`` at the current step: the Python ``0.0`` when it is the constant 0,
        so the kernels leave the term out at trace time, else a tensor."""
        if not callable(self.weight_decay) and self.weight_decay == 0.0:
            return 0.0
        return self._hyper(self.weight_decay, dtype)

    def _heavy_ball_step(self, variable, learning_rate, gradient, nesterov=False, decay=True):
        """Apply ``d = g + wd * w; v = m * v + lr * d; w -= v`` (Nesterov: ``w -= m * v + lr *
        d``): the MXNet/LARS form, where the rate is inside the velocity. Without momentum:
        ``w -= lr * d``. ``decay=False`` leaves the weight decay out (``d = g``). The velocity
        slot stores ``-v`` (:func:`~toolkit.optimizers.kernels.heavy_ball`, as Keras's SGD and
        TensorFlow's ``ResourceApplyKerasMomentum`` do), and so do checkpoints."""
        weight_decay = self._decay_now(variable.dtype) if decay else 0.0
        if not self.uses_momentum:
            self.assign_sub(variable, learning_rate * coupled(gradient, variable, weight_decay))
            return
        velocity = self.velocities[self._get_variable_index(variable)]
        momentum = self._hyper(self.momentum, variable.dtype)
        heavy_ball(variable, velocity, learning_rate, gradient, momentum, nesterov, weight_decay)

    def save_own_variables(self, store):
        """Keras's, over the state only (:func:`state_variables`), so a saved model loads on
        every backend."""
        for i, variable in enumerate(state_variables(self)):
            store[str(i)] = variable.numpy()

    def load_own_variables(self, store):
        """Keras's, over the state only (a count that differs: Keras's warning, and no load)."""
        state = state_variables(self)
        if len(store.keys()) != len(state):
            return super().load_own_variables(store)
        for i, variable in enumerate(state):
            variable.assign(store[str(i)])

    def get_config(self):
        config = super().get_config()
        for name in self._hyperparameters:
            config[name] = keras.saving.serialize_keras_object(getattr(self, name))
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        for name in cls._hyperparameters:
            if isinstance(config.get(name), dict):
                config[name] = keras.saving.deserialize_keras_object(
                    config[name], custom_objects=custom_objects
                )
        return super().from_config(config, custom_objects=custom_objects)
