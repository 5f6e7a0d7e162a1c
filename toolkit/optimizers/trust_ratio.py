"""The layer-wise trust ratio shared by LARS and LBSGD's ``lars`` warmup."""

from __future__ import annotations

import dataclasses
import math

import keras
from keras import ops

from toolkit import backends
from toolkit.optimizers.kernels import fused_kernels_for, l2_norm


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


@dataclasses.dataclass(frozen=True)
class RatioRule:
    """How a trust ratio is read from the norms ``||w||`` and ``||g||``::

    ratio = coefficient * trust_ratio(||w||, ||g||, weight_decay, power, epsilon)
    ratio = 1                      where unit_at_zero and ||w|| or ||g|| is not > 0
    ratio = clip(ratio, *bounds)
    """

    power: int = 1
    epsilon: float = 0.0
    coefficient: float = 1.0
    unit_at_zero: bool = False
    bounds: tuple[float, float] = (-math.inf, math.inf)

    def of_norms(self, weight_norm, grad_norm, weight_decay):
        """The ratio from the norms: scalars, or vectors of one norm per variable."""
        ratio = self.coefficient * trust_ratio(
            weight_norm, grad_norm, weight_decay, power=self.power, epsilon=self.epsilon
        )
        if self.unit_at_zero:
            both_positive = ops.logical_and(weight_norm > 0, grad_norm > 0)
            ratio = ops.where(both_positive, ratio, ops.ones_like(ratio))
        unbounded = self.bounds == (-math.inf, math.inf)
        return ratio if unbounded else ops.clip(ratio, *self.bounds)


def layer_trust_ratio(variable, gradient, weight_decay, rule=RatioRule(), *, grad_norm=None):
    """The ratio an optimizer applies to ``variable`` for ``gradient`` by ``rule``, as a
    scalar tensor.

    On a CPU variable with the fused library (``fused_kernels.cc``) this is one kernel making
    one parallel pass over ``w`` and ``g``, computed in double; otherwise the norms, then
    :meth:`RatioRule.of_norms`. ``grad_norm``, if given, is taken as ``||g||`` (``gradient``
    is then not read).
    """
    fused = fused_kernels_for(variable) if grad_norm is None else None
    if fused is not None:
        dtype = variable.dtype
        return fused.TrustRatio(
            var=variable,
            grad=gradient,
            weight_decay=ops.cast(weight_decay, dtype),
            epsilon=ops.cast(rule.epsilon, dtype),
            coefficient=ops.cast(rule.coefficient, dtype),
            power=rule.power,
            unit_at_zero=rule.unit_at_zero,
            min_ratio=rule.bounds[0],
            max_ratio=rule.bounds[1],
        )
    weight_norm = l2_norm(variable)
    grad_norm = l2_norm(gradient) if grad_norm is None else ops.cast(grad_norm, weight_norm.dtype)
    return rule.of_norms(weight_norm, grad_norm, weight_decay)


NONE_YET = -1.0
"""What :class:`AppliedRatios` holds for a variable no update has given a ratio yet (a ratio is
never negative), read as NaN: not NaN itself, which JAX's check that every worker creates the
same variable (several workers) cannot compare."""


class AppliedRatios:
    """The ratio the latest update applied to each of some variables, for logging (NaN before
    the first update). Kept in one vector outside the optimizer's tracked variables, so
    ``optimizer.variables``, checkpoints and the broadcast of optimizer state do not see it;
    on JAX, whose compiled step is stateless and returns only tracked variables, the backend
    carries it as one of them (:meth:`~toolkit.backends.base.Backend.carry`), which a saved
    model leaves out (:func:`~toolkit.optimizers.base.state_variables`), so it loads on every
    backend.

    An update holds each variable's ratio as it goes (:meth:`record`) and keeps them all at its
    end in one assignment (:meth:`write`): one op per update rather than one per layer, which
    on ResNet-50 cost about 1 ms of a 25 ms LARS update.

    ``optimizer``: the one that applies them, being built; ``variables``: its variables, in its
    order; ``indices``: those with a ratio.
    """

    def __init__(self, optimizer, variables, indices):
        indices = list(indices)
        self._paths = [variables[i].path for i in indices]
        self._position = {index: position for position, index in enumerate(indices)}
        self._dtype = keras.backend.result_type(*(variables[i].dtype for i in indices))
        self._ratios = keras.Variable(
            ops.full((len(indices),), NONE_YET, self._dtype),
            trainable=False,
            name="applied_trust_ratios",
        )
        backends.current().carry(optimizer, [self._ratios])
        self._pending = {}
        self._whole = None

    @property
    def variable(self) -> keras.Variable:
        """The vector of ratios, one per variable with a ratio, in the optimizer's order."""
        return self._ratios

    def record(self, index: int, ratio) -> None:
        """Hold ``ratio``, the one the update of variable ``index`` applies now."""
        self._pending[self._position[index]] = ops.cast(ratio, self._dtype)

    def record_all(self, indices: list[int], ratios) -> None:
        """Hold ``ratios``, the vector of the ratios the update of variables ``indices`` applies
        now (the multi-tensor update's): kept as it is when it holds every ratio in order."""
        if [self._position[i] for i in indices] == list(range(len(self._paths))):
            self._whole = ops.cast(ratios, self._dtype)
            return
        for index, ratio in zip(indices, ops.unstack(ratios), strict=True):
            self.record(index, ratio)

    def write(self, applies=True) -> None:
        """Keep the ratios recorded since the last write (the others keep their value), where
        ``applies`` (a Python or tensor boolean: whether the update applied) holds."""
        old, new, self._whole = self._ratios.value, self._whole, None
        if new is None:
            if not self._pending:
                return
            positions, ratios = zip(*sorted(self._pending.items()), strict=True)
            self._pending = {}
            new = ops.stack(ratios)
            if len(positions) < len(self._paths):
                new = ops.scatter_update(old, [[p] for p in positions], new)
        self._ratios.assign(new if applies is True else ops.where(applies, new, old))

    def read(self) -> dict[str, float]:
        """The latest ratios, keyed by variable path."""
        ratios = ops.convert_to_numpy(self._ratios).tolist()
        return {
            path: math.nan if ratio == NONE_YET else ratio
            for path, ratio in zip(self._paths, ratios, strict=True)
        }
