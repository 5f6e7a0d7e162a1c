"""Learning-rate (and momentum, weight-decay) schedules, and the builders configs name them by.

Keras already has polynomial, exponential (with ``staircase``) and cosine decay; the config's
names build them (:data:`toolkit.catalog.SCHEDULES`, the builders at the end of this module),
not rewrite them. This module adds what large-batch training needs on top:

* :class:`Warmup` wraps any schedule with Goyal et al.'s gradual warmup,
* :class:`MultiFactor` is MXNet's ``MultiFactorScheduler`` (step decay at given steps),
* :class:`Poly` is MXNet's ``PolyScheduler`` (``base * (1 - n/max)**power``, 0 after ``max``).

A schedule is called with ``n``, the optimizer's 0-based step: the number of updates (optimizer
calls) made before the current one, exactly what Keras passes to a learning-rate schedule. Every
schedule serialises with ``get_config`` and works as any Keras optimizer's ``learning_rate`` and
as the ``momentum``/``weight_decay`` of the toolkit's optimizers.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import keras
from keras import ops
from keras.optimizers.schedules import (
    CosineDecay,
    ExponentialDecay,
    LearningRateSchedule,
    PolynomialDecay,
)

from toolkit.catalog import SCHEDULES
from toolkit.optimizer_rules import WARMUP_STRATEGIES


def warmup_ramp(strategy: str, progress):
    """The warmup ramp ``r(p)`` for progress ``p = n/N`` in [0, 1].

    ``linear``: ``p``; ``power2``: ``p**2``; ``sqrt``: ``sqrt(p)`` (MXNet LBSGD's strategies).
    """
    if strategy == "linear":
        return progress
    if strategy == "power2":
        return ops.square(progress)
    if strategy == "sqrt":
        return ops.sqrt(progress)
    raise ValueError(f"warmup strategy must be one of {WARMUP_STRATEGIES}, got {strategy!r}")


def value_at(hyperparameter: float | Callable, step, dtype="float32"):
    """A hyperparameter's value at ``step``: a constant, or a schedule called with the step."""
    value = hyperparameter(step) if callable(hyperparameter) else hyperparameter
    return ops.cast(value, dtype)


class Wrapper(LearningRateSchedule):
    """A schedule around another, ``self.schedule`` (a schedule or a constant), which its config
    holds serialised; a subclass gives its other constructor arguments in :meth:`arguments`."""

    def arguments(self) -> dict:
        raise NotImplementedError

    def get_config(self):
        return {"schedule": keras.saving.serialize_keras_object(self.schedule), **self.arguments()}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["schedule"] = keras.saving.deserialize_keras_object(config["schedule"])
        return cls(**config)


@keras.saving.register_keras_serializable(package="toolkit")
class Warmup(Wrapper):
    """Gradual warmup (Goyal et al. 2017) in front of any schedule.

    For ``n < warmup_steps`` the wrapped schedule's value is multiplied by
    ``initial_multiplier + (1 - initial_multiplier) * r(n / warmup_steps)`` with ``r`` the
    ``strategy`` ramp (see :func:`warmup_ramp`); from ``warmup_steps`` on it is unchanged. The
    wrapped schedule is evaluated at the absolute step ``n``, so its decay milestones stay where
    they were. Goyal et al.'s recipe for a batch ``k`` times the reference is ``Warmup(k * lr,
    5 epochs, "linear", initial_multiplier=1/k)``.
    """

    def __init__(
        self,
        schedule: float | LearningRateSchedule,
        warmup_steps: int,
        strategy: str = "linear",
        initial_multiplier: float = 0.0,
    ):
        if strategy not in WARMUP_STRATEGIES:
            raise ValueError(
                f"Warmup strategy must be one of {WARMUP_STRATEGIES}, got {strategy!r}"
            )
        if warmup_steps < 0:
            raise ValueError(f"Warmup warmup_steps must be >= 0, got {warmup_steps}")
        if not 0.0 <= initial_multiplier <= 1.0:
            raise ValueError(
                f"Warmup initial_multiplier must be in [0, 1], got {initial_multiplier}"
            )
        self.schedule = schedule
        self.warmup_steps = int(warmup_steps)
        self.strategy = strategy
        self.initial_multiplier = float(initial_multiplier)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        target = value_at(self.schedule, step)
        if self.warmup_steps == 0:
            return target
        progress = ops.minimum(step / self.warmup_steps, 1.0)
        ramp = warmup_ramp(self.strategy, progress)
        return target * (self.initial_multiplier + (1.0 - self.initial_multiplier) * ramp)

    def arguments(self):
        return {
            "warmup_steps": self.warmup_steps,
            "strategy": self.strategy,
            "initial_multiplier": self.initial_multiplier,
        }


@keras.saving.register_keras_serializable(package="toolkit")
class MultiFactor(LearningRateSchedule):
    """Step decay at chosen steps (MXNet ``MultiFactorScheduler``).

    ``lr(n) = base * factor ** k`` where ``k`` is the number of milestones ``s`` in ``steps``
    with ``n > s``. Milestones must increase strictly; ``0 < factor <= 1``.
    """

    def __init__(self, base: float, steps: list[int], factor: float = 0.1):
        steps = [int(s) for s in steps]
        if not steps or any(b <= a for a, b in itertools.pairwise(steps)) or steps[0] < 0:
            raise ValueError(
                f"MultiFactor steps must be a non-empty, strictly increasing list of "
                f"non-negative integers, got {steps}"
            )
        if not 0.0 < factor <= 1.0:
            raise ValueError(f"MultiFactor factor must be in (0, 1], got {factor}")
        self.base = float(base)
        self.steps = steps
        self.factor = float(factor)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        passed = ops.sum(ops.cast(ops.greater(step, ops.array(self.steps, "float32")), "float32"))
        return self.base * ops.power(self.factor, passed)

    def get_config(self):
        return {"base": self.base, "steps": self.steps, "factor": self.factor}


@keras.saving.register_keras_serializable(package="toolkit")
class Poly(PolynomialDecay):
    """Polynomial decay to zero (MXNet ``PolyScheduler``).

    ``lr(n) = base_lr * (1 - n / max_update) ** power`` for ``n <= max_update``, 0 after. This
    is Keras's ``PolynomialDecay`` with ``end_learning_rate=0``, under MXNet's names.
    """

    def __init__(self, base_lr: float, max_update: int, power: float = 2.0):
        if max_update < 1:
            raise ValueError(f"Poly max_update must be >= 1, got {max_update}")
        super().__init__(
            initial_learning_rate=base_lr,
            decay_steps=max_update,
            end_learning_rate=0.0,
            power=power,
        )

    def __call__(self, step):
        """The steps left are counted first, ``(max_update - n) / max_update``: exact in float32
        up to the division, where ``1 - n / max_update`` cancels near the end of the run (and
        XLA on a GPU divides to within a few ulps, which that cancellation multiplies)."""
        total = ops.cast(self.decay_steps, "float32")
        left = total - ops.minimum(ops.cast(step, "float32"), total)
        return self.initial_learning_rate * ops.power(left / total, self.power)

    def get_config(self):
        return {
            "base_lr": self.initial_learning_rate,
            "max_update": self.decay_steps,
            "power": self.power,
        }


# ---------------------------------------------------------------------- the config's schedules
# Each takes the run's toolkit.catalog.SCHEDULE_INPUTS (the scaled base rate, the run's length
# and its epoch, in the schedule's steps), then its own parameters, whose lengths are in epochs
# and whose defaults the catalog's table gives: a name added there is a config's choice, the
# form's and a builder at once.


def constant(base: float, total_steps: int, steps_per_epoch: int) -> float:
    """The base rate throughout."""
    return base


def poly(base: float, total_steps: int, steps_per_epoch: int, *, power: float) -> Poly:
    """MXNet's ``PolyScheduler``: to 0 at the end of the run."""
    return Poly(base, total_steps, power=power)


def polynomial(
    base: float, total_steps: int, steps_per_epoch: int, *, power: float, end_learning_rate: float
) -> PolynomialDecay:
    """Keras's ``PolynomialDecay`` to ``end_learning_rate`` at the end of the run."""
    return PolynomialDecay(base, total_steps, end_learning_rate=end_learning_rate, power=power)


def cosine(base: float, total_steps: int, steps_per_epoch: int, *, alpha: float) -> CosineDecay:
    """Keras's ``CosineDecay`` over the run, to ``alpha`` times the base rate."""
    return CosineDecay(base, total_steps, alpha=alpha)


def exponential(
    base: float,
    total_steps: int,
    steps_per_epoch: int,
    *,
    decay_epochs: float,
    decay_rate: float,
    staircase: bool,
) -> ExponentialDecay:
    """Keras's ``ExponentialDecay``: times ``decay_rate`` every ``decay_epochs`` (at least a
    step), smoothly or, with ``staircase``, at once."""
    decay_steps = max(1, round(decay_epochs * steps_per_epoch))
    return ExponentialDecay(base, decay_steps, decay_rate=decay_rate, staircase=staircase)


def multifactor(
    base: float, total_steps: int, steps_per_epoch: int, *, epochs: list[float], factor: float
) -> MultiFactor:
    """MXNet's ``MultiFactorScheduler``: times ``factor`` after each of the milestone
    ``epochs``."""
    return MultiFactor(base, [round(e * steps_per_epoch) for e in epochs], factor)


def get(name: str, base: float, total_steps: int, steps_per_epoch: int, **params):
    """The schedule a config names: ``name``'s builder (:data:`toolkit.catalog.SCHEDULES`)
    given the run's base rate and lengths and ``params`` (errors list what is allowed)."""
    return SCHEDULES.get(name, base, total_steps, steps_per_epoch, **params)
