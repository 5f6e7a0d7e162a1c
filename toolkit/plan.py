"""A run's resolved plan: every number training derives from its config, computed in one place.

A config says what a researcher asked for ("32 examples per worker, linear scaling from 256,
a 5-epoch warm-up"); its plan says what that means on ``W`` workers and a training set of
``n`` examples ("a global batch of 64, 2 steps per update, a rate of 0.025, 390 warm-up steps,
195 steps an epoch"). Training, the callbacks, the schedule, the Launch form's preview, the
sweeps' estimates and the runs table all read these objects, so the rate a preview shows is
the rate training uses, by construction.

Two objects, because some readers have no dataset at hand:

- :class:`Scale` (``Scale.of(config, W)``): the config on ``W`` workers, before any data: how
  one update's examples split into steps, and the learning rate that batch scales to;
- :class:`RunPlan` (``RunPlan.of(config, n, W)``), a :class:`Scale` plus the epochs: steps per
  epoch, the schedule's length and warm-up, AdaScale's clock, the intervals of events.

The words: a *step* is one batch of ``per_worker`` examples on every worker (one call of the
optimizer); an *update* applies the mean gradient of ``steps_per_update`` steps (local
accumulation, times LBSGD's ``batch_scale``); the *global batch* is the examples of one
update over all workers::

    global_batch = per_worker * W * steps_per_update
    learning_rate = optimizer.learning_rate * global_batch / lr_scaling.base_batch  (linear)
    learning_rate = optimizer.learning_rate * sqrt(global_batch / base_batch)       (sqrt)

The rules that span sections are :mod:`toolkit.config_rules`'. The plan imports nothing that
needs TensorFlow: the dashboard reads it too.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from toolkit import optimizer_rules
from toolkit.errors import ConfigError
from toolkit.experiment import Experiment

NOISE_SCALE_AUTO = {"allreduce": 25, "one worker": 100}
"""Updates between two noise-scale measurements when ``logging.noise_scale_every_steps`` is
``auto``: nearly free in the allreduce hook (several workers), an extra gradient each with one."""


def shard_size(num_examples: int, num_shards: int = 1) -> int:
    """Examples per worker and epoch: the same on every worker (the remainder is dropped)."""
    return num_examples // num_shards


def noise_batches(measured: int, world_size: int, global_batch: int) -> tuple[int, int]:
    """The two batch sizes ``(b_small, b_big)`` the gradient noise scale is measured at: each
    worker's examples per update and the global batch with several workers (the allreduce
    hook); two halves of an extra batch of ``measured`` examples with one
    (:class:`~toolkit.training.callbacks.HalfBatchNorms`)."""
    if world_size > 1:
        return global_batch // world_size, global_batch
    half = measured // 2
    return half, 2 * half


def world_sizes(config: Experiment) -> range:
    """The numbers of workers the run may train with: ``workers``, or the elastic range."""
    if config.elastic is None:
        return range(config.workers, config.workers + 1)
    return range(config.elastic.min_workers, config.elastic.max_workers + 1)


@dataclasses.dataclass(frozen=True)
class Scale:
    """A config on ``world_size`` workers, before any data: how one update's examples split
    into steps, and the learning rate that batch scales to. Build it with :meth:`of`."""

    world_size: int
    per_worker: int
    """Examples per worker per step: ``batch.per_worker``, or ``batch.global_size`` split."""
    steps_per_update: int
    """Steps each worker sums per update (an adaptive batch's first)."""
    most_steps_per_update: int
    """Its largest: an adaptive batch's at ``batch.adaptive.max``, else the same."""
    adaptive: bool
    """Whether the global batch follows the noise scale (``batch.adaptive``)."""
    learning_rate: float
    """The base rate after ``lr_scaling``: what the schedule starts from."""
    warmup_multiplier: float
    """The fraction of :attr:`learning_rate` the warm-up starts at."""
    noise_every: int
    """Updates between two noise-scale measurements (0: none), ``auto`` resolved."""
    noise_in_allreduce: bool
    """Whether the noise scale is measured in the allreduce hook (several workers, or an
    elastic run, which may grow) rather than from two halves of an extra batch."""
    noise_batch: int
    """That extra batch's examples otherwise: ``logging.noise_scale_batch``, else
    :attr:`per_worker`."""

    @classmethod
    def of(cls, config: Experiment, world_size: int | None = None) -> Scale:
        """``config`` on ``world_size`` workers (default: its ``workers``). Raises
        :class:`~toolkit.errors.ConfigError` if ``batch.global_size`` does not split evenly."""
        return cls(**_scale_fields(config, world_size or config.workers))

    @property
    def global_batch(self) -> int:
        """Examples per update over all workers (an adaptive batch's first)."""
        return self.per_worker * self.world_size * self.steps_per_update

    @property
    def examples_per_step(self) -> int:
        """Examples of one step over all workers."""
        return self.per_worker * self.world_size

    @property
    def noise_batches(self) -> tuple[int, int]:
        """The two batch sizes the noise scale is measured at, as the run starts
        (:func:`noise_batches`)."""
        return noise_batches(self.noise_batch, self.world_size, self.global_batch)


@dataclasses.dataclass(frozen=True)
class RunPlan(Scale):
    """A :class:`Scale` on a training set of ``num_train`` examples: the epochs, the
    schedule's length, AdaScale's clock and the intervals training acts at. Build it with
    :meth:`of`."""

    num_train: int
    steps_per_epoch: int
    """Steps per worker and epoch: its shard over ``per_worker``, capped by
    ``steps_per_epoch``; an adaptive batch's is a whole number of updates at its largest."""
    epochs: int
    """``epochs``: the schedule's length (with AdaScale, the base run's epochs)."""
    last_epoch: int
    """The epoch training goes to at most: ``epochs``; with AdaScale as many as its base
    run's updates take at a gain of 1 (it ends sooner, once its clock has done them)."""
    schedule_steps_per_epoch: int
    """The schedule's steps per epoch: :attr:`steps_per_epoch`, or with AdaScale the base
    run's updates per epoch (its schedule is read on the base run's clock)."""
    warmup_steps: int
    """The warm-up's length in the schedule's steps."""
    base_updates: int | None
    """AdaScale's base run's updates, which its clock counts to (``None`` without AdaScale)."""
    event_every: int
    trust_ratio_every: int
    system_every: int
    """Steps between samples of the workers' system metrics (0: none)."""
    noise_smoothing: float
    checkpoint_every: int

    @classmethod
    def of(cls, config: Experiment, num_train: int, world_size: int | None = None) -> RunPlan:
        """``config`` on ``world_size`` workers (default: its ``workers``) and ``num_train``
        training examples. Raises :class:`~toolkit.errors.ConfigError` naming the field when
        a worker's shard is smaller than its batch, or AdaScale's base batch or an adaptive
        batch's largest is larger than the training set."""
        scale = _scale_fields(config, world_size or config.workers)
        spe = _steps_per_epoch(config, num_train, scale)
        logging, adascale = config.logging, config.lr_scaling.rule == "adascale"
        schedule_epoch = _base_updates_per_epoch(config, num_train) if adascale else spe
        base_updates = config.epochs * schedule_epoch if adascale else None
        last = config.epochs
        if adascale:  # at a gain of 1, at its largest batch
            last = -(-base_updates * scale["most_steps_per_update"] // spe)
        return cls(
            **scale,
            num_train=num_train,
            steps_per_epoch=spe,
            epochs=config.epochs,
            last_epoch=last,
            schedule_steps_per_epoch=schedule_epoch,
            warmup_steps=round(config.schedule.warmup.epochs * schedule_epoch),
            base_updates=base_updates,
            event_every=logging.every_steps,
            trust_ratio_every=logging.trust_ratio_every_steps,
            system_every=logging.every_steps * logging.system_every_events,
            noise_smoothing=logging.noise_scale_smoothing,
            checkpoint_every=config.checkpoint.every_epochs,
        )

    @property
    def schedule_steps(self) -> int:
        """The schedule's length, in its steps: :attr:`epochs` of them."""
        return self.epochs * self.schedule_steps_per_epoch

    @property
    def updates_per_epoch(self) -> int:
        """Updates in an epoch (at least 1; an adaptive batch's first): what a sparsity
        warm-up counts its epochs in."""
        return max(1, self.steps_per_epoch // self.steps_per_update)

    @property
    def total_steps(self) -> int:
        """Steps per worker the run takes at most (AdaScale: at a gain of 1, at its largest
        batch)."""
        if self.base_updates is not None:
            return self.base_updates * self.most_steps_per_update
        return self.epochs * self.steps_per_epoch

    @property
    def total_updates(self) -> int:
        """Updates the run takes at most (AdaScale: its base run's)."""
        if self.base_updates is not None:
            return self.base_updates
        return self.total_steps // self.steps_per_update

    @property
    def noise_steps(self) -> int:
        """Steps between two noise-scale measurements (0: none)."""
        return self.noise_every * self.steps_per_update

    def steps_per_execution(self, trust_ratios: bool) -> int:
        """How many steps Keras runs per call of the compiled train function (its
        ``steps_per_execution``), so that Python, the callbacks and the host read of the loss
        run once per ``k`` steps instead of every step; ``trust_ratios``: whether the
        optimizer applies them (they are logged every :attr:`trust_ratio_every` steps).

        The rule: the largest ``k`` that divides every interval a callback acts on (the
        events', the trust ratios', the one-worker noise scale's in steps, and the epoch),
        so each of them still acts at exactly its step, and that is below the event interval
        (1 if that is 1), so the first event's throughput clock starts before it. Measured
        in the allreduce hook, the noise scale is only read by a callback, so its interval
        need not be a multiple of ``k``; ``k`` is only kept at most that interval, so every
        measurement is read before the next. AdaScale takes ``k = 1``: it ends at the update
        its clock reaches the end, and with one worker measures before every update.
        Training is unchanged: the same steps in the same order, to the bit. Only the NaN
        guard coarsens: a non-finite loss is caught at the end of its execution, at most
        ``k - 1`` steps late."""
        if self.base_updates is not None:
            return 1
        intervals = [self.steps_per_epoch, self.event_every]
        if trust_ratios:
            intervals.append(self.trust_ratio_every)
        if self.noise_steps and not self.noise_in_allreduce:
            intervals.append(self.noise_steps)
        common = math.gcd(*intervals)
        most = min(common, self.event_every - 1)
        if self.noise_steps and self.noise_in_allreduce:
            most = min(most, self.noise_steps)
        return max((k for k in range(1, most + 1) if common % k == 0), default=1)

    def meta(self) -> dict[str, Any]:
        """What ``meta.json`` keeps of the plan, for readers outside the run: the world, the
        global batch and rate, and what a progress bar counts to (AdaScale: its clock's
        base-run updates)."""
        return {
            "world_size": self.world_size,
            "global_batch": self.global_batch,
            "learning_rate": self.learning_rate,
            "steps_per_epoch": self.steps_per_epoch,
            "total_steps": self.base_updates or self.epochs * self.steps_per_epoch,
        }


# ----------------------------------------------------------------------------- the arithmetic


def batches_per_update(config: Experiment, world_size: int) -> int:
    """Per-worker batches in one update over all workers: the workers times the local
    accumulation, times the optimizer's own (LBSGD's ``batch_scale``); an adaptive
    batch's first, ``batch.adaptive.min``, in per-worker batches."""
    batch = config.batch
    if batch.adaptive is not None:
        return batch.adaptive.min // batch.per_worker
    return world_size * batch.accumulation * (config.optimizer.accumulated_batches() or 1)


def _scale_fields(config: Experiment, world_size: int) -> dict[str, Any]:
    batch, scaling = config.batch, config.lr_scaling
    splits = batches_per_update(config, world_size)
    per_worker = batch.per_worker
    if batch.global_size is not None:
        if batch.global_size % splits:
            raise ConfigError(
                f"batch.global_size={batch.global_size} must be a multiple of workers x "
                f"accumulation ({optimizer_rules.own_accumulation_words()}) = {splits}"
            )
        per_worker = batch.global_size // splits
    steps = splits // world_size
    most = steps
    if batch.adaptive is not None:
        most = batch.adaptive.max // (per_worker * world_size)
    ratio = per_worker * splits / scaling.base_batch
    factor = {"none": 1.0, "adascale": 1.0, "linear": ratio, "sqrt": ratio**0.5}[scaling.rule]
    learning_rate = config.optimizer.learning_rate * factor
    warmup = config.schedule.warmup
    multiplier = warmup.initial_multiplier
    if warmup.from_unscaled:
        multiplier = min(1.0, config.optimizer.learning_rate / learning_rate)
    hooked = world_size > 1 or config.elastic is not None
    noise_every = config.logging.noise_scale_every_steps
    if noise_every == "auto":
        noise_every = NOISE_SCALE_AUTO["allreduce" if hooked else "one worker"]
    return {
        "world_size": world_size,
        "per_worker": per_worker,
        "steps_per_update": steps,
        "most_steps_per_update": most,
        "adaptive": batch.adaptive is not None,
        "learning_rate": learning_rate,
        "warmup_multiplier": multiplier,
        "noise_every": noise_every,
        "noise_in_allreduce": hooked,
        "noise_batch": config.logging.noise_scale_batch or per_worker,
    }


def _steps_per_epoch(config: Experiment, num_train: int, scale: dict[str, Any]) -> int:
    """At a fixed ``batch.global_size`` G it is the same on any number of workers W that
    divides G, as an elastic run needs: ``⌊⌊n / W⌋ / (G / W)⌋ = ⌊n / G⌋``. An adaptive
    batch's epoch is a whole number of updates at its largest batch, so at any batch it
    takes (powers of two): ``⌊n / max⌋`` of them, whose examples it then takes at whatever
    batch it has."""
    world, per_worker = scale["world_size"], scale["per_worker"]
    steps = shard_size(num_train, world) // per_worker
    if steps < 1:
        raise ConfigError(
            f"batch.per_worker={per_worker} is larger than each of the "
            f"{world} workers' {shard_size(num_train, world)} training examples"
        )
    if scale["noise_batch"] > num_train:
        raise ConfigError(
            f"logging.noise_scale_batch={scale['noise_batch']} is larger than the {num_train} "
            "training examples"
        )
    if adaptive := config.batch.adaptive:
        most = scale["most_steps_per_update"]
        if steps < most:
            raise ConfigError(
                f"batch.adaptive.max={adaptive.max} is larger than the {num_train} training "
                "examples"
            )
        steps -= steps % most
    return min(steps, config.steps_per_epoch or steps)


def _base_updates_per_epoch(config: Experiment, num_train: int) -> int:
    """Updates per epoch of AdaScale's base run, at ``lr_scaling.base_batch``."""
    updates = num_train // config.lr_scaling.base_batch
    if updates < 1:
        raise ConfigError(
            f"lr_scaling.base_batch={config.lr_scaling.base_batch} is larger than the "
            f"{num_train} training examples"
        )
    return updates
