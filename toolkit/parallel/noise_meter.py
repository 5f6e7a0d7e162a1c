"""The gradient noise scale's two norms, measured inside the allreduce hook
(:class:`GradientNoiseMeter`); the estimate itself is :mod:`toolkit.scaling.noise_scale`'s."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
from keras import ops

from toolkit import backends


class GradientNoiseMeter:
    """The two squared gradient norms of the noise scale (:mod:`toolkit.scaling.noise_scale`),
    measured inside the allreduce hook every ``every`` updates, on the gradients the loss produced
    (after loss-scale unscaling and local accumulation, before clipping, weight decay or trust
    ratios): ``small_sq``, each worker's own gradient norm² averaged over the workers (one
    scalar allreduce), and ``big_sq``, the norm² of the allreduced gradient. Their batch sizes
    are the per-worker examples per update and the global batch. Read after a step with
    :meth:`read`; the variables live outside the optimizer, so checkpoints do not change (on
    JAX, whose compiled step returns only tracked variables, the backend carries them among the
    optimizer's: :meth:`~toolkit.backends.base.Backend.carry`).
    ``on_measure(small_sq, big_sq)``, if given, is called in the graph with each measurement,
    before the update reads its learning rate (AdaScale's gain: :mod:`toolkit.scaling.adascale`)."""

    def __init__(self, every: int, on_measure: Callable[[Any, Any], None] | None = None):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every, self.on_measure = every, on_measure
        self._backend = backends.current()
        self._updates = keras.Variable(0, dtype="int64", trainable=False)
        self._measured = keras.Variable(0, dtype="int64", trainable=False)
        norm_dtype = self._backend.state_dtype()
        self._small_sq = keras.Variable(0.0, dtype=norm_dtype, trainable=False)
        self._big_sq = keras.Variable(0.0, dtype=norm_dtype, trainable=False)

    def measure(self, local: list, reduced: list | None) -> None:
        """Count one update; on every ``every``-th, record the two norms (every worker must
        call it, as the allreduce hook does). ``reduced=None``: the hook's reduced gradient is
        not the mean one (a sparsified allreduce), so the mean is allreduced here, on the
        measured updates only. Traced into the step or run eagerly, as the backend runs the
        hook."""
        self._updates.assign_add(1)
        count = self._updates.value
        self._backend.when(count % self.every == 0, lambda: self._record(local, reduced, count))

    def _record(self, local: list, reduced: list | None, count) -> None:
        backend, engine = self._backend, self._backend.horovod()
        (small,) = backend.allreduce_mean(engine, [backend.squared_norm(local)])
        mean = backend.allreduce_mean(engine, local) if reduced is None else reduced
        big = backend.squared_norm(mean)
        self._small_sq.assign(ops.cast(small, self._small_sq.dtype))
        self._big_sq.assign(ops.cast(big, self._big_sq.dtype))
        self._measured.assign(count)
        if self.on_measure is not None:
            self.on_measure(small, big)

    def continue_from(self, updates: int) -> None:
        """Count on from ``updates`` done before (a resumed run), so measurements fall on the
        same updates as in a run that was never interrupted."""
        self._updates.assign(updates)

    @property
    def variables(self) -> list[keras.Variable]:
        """Its counters and latest norms: state outside the optimizer, which an elastic run
        commits (:class:`toolkit.parallel.elastic.TrainingState`)."""
        return [self._updates, self._measured, self._small_sq, self._big_sq]

    def read(self) -> tuple[int, float, float]:
        """``(update, small_sq, big_sq)`` of the latest measurement, ``update`` counted from
        1 (0: none yet)."""
        return (
            int(self._measured.numpy()),
            float(self._small_sq.numpy()),
            float(self._big_sq.numpy()),
        )
