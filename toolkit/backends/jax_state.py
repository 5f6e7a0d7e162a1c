"""State that an update writes in Keras's stateless JAX step.

Keras compiles a JAX train step as a pure function of the model's, optimizer's and metrics'
variables, each read and written through a :class:`keras.StatelessScope`; it returns those and
only those. So on JAX:

* state outside them that an update writes (a traffic counter, the noise meter's norms, the
  trust ratios applied) is tracked as the optimizer's (:func:`carry`), and left out of what a
  saved model holds (:func:`carried`);
* a write that happens only where a condition holds cannot branch in Python: the action runs
  in a scope of its own, and each variable it wrote takes the new value where the condition
  holds, the one it had elsewhere (:func:`when`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import keras
from keras.src.backend.common.stateless_scope import get_stateless_scope

_CARRIED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> carried


def carry(optimizer: keras.optimizers.Optimizer, variables: list) -> None:
    """Track ``variables`` as ``optimizer``'s, so its compiled step reads and returns them."""
    carried = _CARRIED.setdefault(optimizer, [])
    for variable in variables:
        if all(variable is not v for v in optimizer.variables):
            optimizer._track_variable(variable)  # as its add_variable does with its own
            carried.append(variable)


def carried(optimizer: keras.optimizers.Optimizer) -> list:
    """What :func:`carry` tracked as ``optimizer``'s."""
    return list(_CARRIED.get(optimizer, ()))


def when(condition: Any, action: Callable[[], None]) -> bool:
    """Inside a stateless scope (a compiled step), run ``action`` and keep each of its writes
    where ``condition`` holds, the value before elsewhere; ``False`` (nothing run) outside
    one."""
    outer = get_stateless_scope()
    if outer is None:
        return False
    with _Writes(outer) as writes:
        action()
    for variable, value in writes.written():
        before = outer.get_current_value(variable)
        before = variable.value if before is None else before
        outer.add_update((variable, keras.ops.where(condition, value, before)))
    return True


class _Writes(keras.StatelessScope):
    """A stateless scope inside ``outer`` that reads what ``outer`` holds and keeps what is
    written in it apart, with the variables written (:meth:`written`)."""

    def __init__(self, outer: keras.StatelessScope):
        super().__init__()
        self._outer, self._variables = outer, {}

    def add_update(self, update) -> None:
        self._variables[id(update[0])] = update[0]
        super().add_update(update)

    def get_current_value(self, variable):
        own = super().get_current_value(variable)
        return self._outer.get_current_value(variable) if own is None else own

    def written(self) -> list[tuple[keras.Variable, Any]]:
        """Each variable written in this scope, with the last value written."""
        return [(v, self.state_mapping[id(v)]) for v in self._variables.values()]
