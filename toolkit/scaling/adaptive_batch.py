"""An adaptive global batch (``batch.adaptive``): the batch follows the measured noise scale.

McCandlish et al. (2018) find the efficient batch near the gradient noise scale, which grows as
the loss falls; AdaptDL/Pollux (OSDI 2021) grow the batch while training. Here, at the start of
every ``every_epochs``-th epoch, the global batch moves a power of two towards ``aim`` times the
smoothed ``B_simple`` (:func:`next_batch`: the nearest power, or with hysteresis only once the
aim is well past the midpoint), and AdaScale's gain (:mod:`toolkit.scaling.adascale`) sets the
learning rate for whatever batch that is. ``aim`` 1 follows the noise scale; a task's
``B_crit / B_simple`` (``python -m toolkit calibrate`` measures it) aims at the critical batch.

The batch changes by *local accumulation*: each worker still takes one batch of ``per_worker``
examples per step, through the same compiled step, and an update sums ``k`` steps' gradients
before they are averaged over the workers, so the global batch is ``k · per_worker · workers``.
``k`` is a variable the compiled step reads (:func:`accumulate`), so changing it retraces
nothing. Epochs of an adaptive run are a whole number of updates at any batch it may take
(:attr:`toolkit.plan.RunPlan.steps_per_epoch`), so a change always falls between two updates.

:class:`Accumulation` is how a run's steps group into updates as it trains, the one place
callbacks and checkpoints ask: a fixed ``k`` for any other run (its plan's), the current ``k``
and where it started for an adaptive one.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from toolkit import backends
from toolkit.optimizers import unwrapped
from toolkit.plan import Scale, noise_batches


def next_batch(
    b_simple: float,
    current: int,
    smallest: int,
    largest: int,
    aim: float = 1.0,
    hysteresis: float = 0.0,
) -> int:
    """The global batch after a decision, aimed at ``aim · b_simple``: twice ``current`` once
    the aim is ``(1.5 + hysteresis / 2)·current`` or more, half ``current`` below
    ``(0.75 − hysteresis / 4)·current``, else ``current``; clipped to ``[smallest, largest]``.
    ``hysteresis`` (0 to 1) is how far past the midpoint to the neighbouring power of two the
    aim must go, as a fraction of the way: 0 is the power of two nearest the aim (a tie goes
    to the larger), at most a factor of 2 from ``current``; 1 moves only once the aim has
    reached the neighbour (``2·current`` up, ``current / 2`` down), so a noisy ``b_simple``
    near a midpoint does not move the batch back and forth. A ``b_simple`` that is not a
    positive finite number (no signal measured yet, or noise estimated below zero) keeps
    ``current``."""
    if not math.isfinite(b_simple) or b_simple <= 0:
        return current
    target = aim * b_simple
    if target >= (1.5 + hysteresis / 2) * current:
        batch = 2 * current
    elif target < (0.75 - hysteresis / 4) * current:
        batch = current // 2
    else:
        batch = current
    return min(max(batch, smallest), largest)


def follow(b_simple: float, accumulation: Accumulation, adascale, adaptive, step: int) -> bool:
    """Decide the batch at ``step`` (an epoch's start, which ends an update) from the averaged
    ``b_simple`` by :func:`next_batch` with ``adaptive``'s bounds, aim and hysteresis (a
    :class:`~toolkit.config.AdaptiveBatchConfig`); if it changes, the ``accumulation`` and
    ``adascale``'s scale and noise batches follow from the next update on. Returns whether it
    changed."""
    was = accumulation.global_batch
    batch = next_batch(b_simple, was, adaptive.min, adaptive.max, adaptive.aim, adaptive.hysteresis)
    if batch != was:
        accumulation.switch(step, batch)
        adascale.rescale(batch, *accumulation.noise_batches())
    return batch != was


class Accumulation:
    """How a run's steps (one batch per worker) group into optimizer updates.

    ``per_worker`` examples per worker and step, ``world`` workers, ``steps_per_update``
    steps (local accumulation) per update from step ``start`` on, which is update
    ``updates_before``. A fixed run has one such stretch from step 0; an adaptive run starts a
    new one at each change (:meth:`switch`). The stretch is kept in a variable, which the
    compiled step reads (``steps_per_update``, :func:`accumulate`) and a checkpoint saves
    (:attr:`variables`), so a resumed run counts on from where it stopped; host reads (every
    step, by the callbacks) use a copy, which :meth:`reload` takes from the variable once it is
    assigned from outside (a restored checkpoint). ``adaptive``: whether the batch may change
    (its events then say which it is); ``noise_batch``: one worker's extra batch for the noise
    scale (default ``per_worker``)."""

    def __init__(
        self,
        per_worker: int,
        world: int,
        steps_per_update: int = 1,
        adaptive: bool = False,
        noise_batch: int | None = None,
    ):
        self.per_worker, self.world, self.adaptive = int(per_worker), int(world), adaptive
        self.noise_batch = int(noise_batch or per_worker)
        self._current = (0, int(steps_per_update), 0)
        self.stretch = keras.Variable(
            self._current, dtype="int64", trainable=False, name="batch_plan"
        )
        self._earlier: list[tuple[int, int, int]] = []

    @classmethod
    def starting(cls, plan: Scale) -> Accumulation:
        """The accumulation a run with ``plan`` starts with (an adaptive batch's first)."""
        return cls(
            plan.per_worker, plan.world_size, plan.steps_per_update, plan.adaptive, plan.noise_batch
        )

    def reload(self) -> None:
        """Take the stretch from its variable, after a checkpoint (or a broadcast) set it."""
        self._current = tuple(int(v) for v in self.stretch.numpy())

    @property
    def steps_per_update(self) -> int:
        return self._current[1]

    @property
    def global_batch(self) -> int:
        """Examples per update now, over all workers."""
        return self.steps_per_update * self.per_worker * self.world

    @property
    def variables(self) -> list[keras.Variable]:
        return [self.stretch]

    def noise_batches(self) -> tuple[int, int]:
        """The two batch sizes ``(b_small, b_big)`` the noise scale is measured at now
        (:func:`toolkit.plan.noise_batches`)."""
        return noise_batches(self.noise_batch, self.world, self.global_batch)

    def updates(self, step: int) -> float:
        """Updates done after ``step`` steps, counting a part-accumulated one as its fraction
        (``int()`` of it: whole updates)."""
        start, per_update, before = self._stretch(step)
        return before + (step - start) / per_update

    def starts_update(self, step: int) -> bool:
        """Whether the step after ``step`` steps begins a new update."""
        start, per_update, _ = self._stretch(step)
        return (step - start) % per_update == 0

    def step_of(self, update: int) -> int:
        """The steps done once update ``update`` (counted from 1) is, in the current
        stretch."""
        start, per_update, before = self._stretch(None)
        return start + (update - before) * per_update

    def switch(self, step: int, global_batch: int) -> None:
        """From ``step`` (which ends an update) on, updates take ``global_batch`` examples."""
        step_batch = self.per_worker * self.world
        if global_batch % step_batch or not self.starts_update(step):
            raise ValueError(
                f"cannot switch to a global batch of {global_batch} at step {step}: it must be a "
                f"multiple of {step_batch} examples per step, at the end of an update"
            )
        self._earlier.append(self._current)
        self._current = (step, global_batch // step_batch, round(self.updates(step)))
        self.stretch.assign(self._current)

    def _stretch(self, step: int | None) -> tuple[int, int, int]:
        """``(start, steps_per_update, updates_before)`` of the stretch holding ``step`` (the
        current one for ``None``, or a step at or after its start). Earlier stretches are the
        ones this process switched from; a resumed run starts with its checkpoint's."""
        current = self._current
        if step is None or step >= current[0]:
            return current
        return max((s for s in self._earlier if s[0] <= step), default=current)


def accumulate(
    optimizer: keras.optimizers.Optimizer, accumulation: Accumulation, variables: list
) -> None:
    """Make ``optimizer`` apply an update to ``variables`` every
    ``accumulation.steps_per_update`` calls, with the mean of their gradients. The count is
    read from the accumulation's variable at every call, so it may change between updates
    without retracing (Keras's ``gradient_accumulation_steps`` is fixed when the step is
    traced). As there, the calls in between only add to one accumulator per variable, and the
    optimizer's ``iterations`` count updates; the update itself (the allreduce hook included)
    runs once per count. Replaces ``apply`` on the instance: call it after
    :func:`~toolkit.parallel.distributed.DistributedOptimizer`, which hooks inside ``apply``."""
    variables = list(variables)
    optimizer.build(variables)
    sums = [keras.Variable(ops.zeros(v.shape, v.dtype), trainable=False) for v in variables]
    count = keras.Variable(0, dtype="int64", trainable=False, name="accumulated_steps")
    apply = optimizer.apply  # the class's, bound
    backend = backends.current()
    backend.carry(unwrapped(optimizer), [*sums, count, *accumulation.variables])

    def accumulate_then_apply(grads, trainable_variables=None):
        for total, grad in zip(sums, grads, strict=True):
            if grad is not None:
                total.assign_add(ops.cast(grad, total.dtype))
        count.assign_add(1)
        done = count.value

        def update():
            apply([total.value / ops.cast(done, total.dtype) for total in sums], variables)
            for total in sums:
                total.assign(ops.zeros_like(total.value))
            count.assign(0)

        backend.when(done >= accumulation.stretch.value[1], update)

    optimizer.apply = accumulate_then_apply
