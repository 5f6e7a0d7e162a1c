"""Turn a validated :class:`~toolkit.config.ExperimentConfig` and its plan
(:class:`~toolkit.plan.RunPlan`) into the objects a run uses: its data, model, schedule and
optimizer.

Training, the app's schedule preview and notebooks all go through these functions and read the
same plan, so the rate a preview shows is the rate training uses.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import pandas as pd
import tensorflow as tf

from toolkit import backends, optimizers
from toolkit.config import ExperimentConfig
from toolkit.optimizers import schedules
from toolkit.optimizers.schedules import Warmup
from toolkit.plan import RunPlan
from toolkit.rates import PREVIEW_POINTS, preview_steps
from toolkit.scaling.adascale import AdaScale
from toolkit.training import data, models


def load_dataset(config: ExperimentConfig) -> data.Dataset:
    """The configured dataset, generated or split with the run's seed."""
    return data.load(config.dataset.name, seed=config.seed, **config.dataset.params)


def train_batches(
    plan: RunPlan,
    dataset: data.Dataset,
    epoch: int,
    *,
    seed: int,
    rank: int = 0,
    last: int | None = None,
) -> tf.data.Dataset:
    """Worker ``rank``'s batches of epochs ``epoch`` to ``last`` (default: ``epoch`` alone):
    its shard of the training set in each epoch's order (seeded by ``seed``), the plan's
    steps per epoch in batches of its per-worker size, built lazily
    (:func:`toolkit.training.data.epochs_dataset`)."""
    return data.epochs_dataset(
        dataset.x_train,
        dataset.y_train,
        batch_size=plan.per_worker,
        epochs=range(epoch, epoch + 1 if last is None else last),
        steps_per_epoch=plan.steps_per_epoch,
        seed=seed,
        num_shards=plan.world_size,
        shard_index=rank,
    )


def test_batches(dataset: data.Dataset) -> tf.data.Dataset:
    """The whole test set in order, in batches of 256 (the last one smaller): what every
    epoch's evaluation reads, on every worker."""
    return data.epoch_dataset(
        dataset.x_test, dataset.y_test, batch_size=256, shuffle=False, drop_remainder=False
    )


def build_model(config: ExperimentConfig, dataset: data.Dataset) -> keras.Model:
    """The configured model for ``dataset``'s inputs and classes, initialised from the seed."""
    return models.build(
        config.model.name,
        input_shape=dataset.input_shape,
        num_classes=dataset.num_classes,
        seed=config.seed,
        **config.model.params,
    )


def learning_rate_schedule(config: ExperimentConfig, plan: RunPlan):
    """The learning-rate schedule: the scaled base rate, the named schedule over the run
    (:data:`toolkit.catalog.SCHEDULES`), the warm-up in front."""
    schedule = schedules.get(
        config.schedule.name,
        plan.learning_rate,
        plan.schedule_steps,
        plan.schedule_steps_per_epoch,
        **config.schedule.params,
    )
    return Warmup(
        schedule,
        warmup_steps=plan.warmup_steps,
        strategy=config.schedule.warmup.strategy,
        initial_multiplier=plan.warmup_multiplier,
    )


def build_optimizer(config: ExperimentConfig, plan: RunPlan) -> keras.optimizers.Optimizer:
    """The configured optimizer with the scheduled learning rate. An optimizer that counts
    its updates per epoch (LBSGD's ``updates_per_epoch``) gets the run's real steps per
    epoch unless the config sets it. AdaScale's rate (``lr_scaling.rule: adascale``) is its
    base schedule, laid out over the base run's epochs, times its gain
    (:class:`~toolkit.scaling.adascale.AdaScale`)."""
    params = dict(config.optimizer.params)
    if "updates_per_epoch" in optimizers.OPTIMIZERS.parameters(config.optimizer.name):
        params.setdefault("updates_per_epoch", plan.steps_per_epoch)
    learning_rate = learning_rate_schedule(config, plan)
    if plan.base_updates is not None:
        b_small, b_big = plan.noise_batches
        learning_rate = AdaScale(
            learning_rate,
            batch=plan.global_batch,
            base_batch=config.lr_scaling.base_batch,
            b_small=b_small,
            b_big=b_big,
            smoothing=plan.noise_smoothing,
            total=plan.base_updates,
        )
    return optimizers.get(config.optimizer.name, learning_rate=learning_rate, **params)


def adascale_of(optimizer: keras.optimizers.Optimizer) -> AdaScale | None:
    """The :class:`~toolkit.scaling.adascale.AdaScale` rate of ``optimizer`` (or of the one a
    wrapper holds), if it has one."""
    rate = optimizers.unwrapped(optimizer)._learning_rate
    return rate if isinstance(rate, AdaScale) else None


def rates_at(optimizer: keras.optimizers.Optimizer) -> Callable[[int], tuple[float, float | None]]:
    """A function of the 0-based step giving ``(learning rate, momentum)`` as ``optimizer``
    applies them there: LBSGD's warmup multiplier is included (its ``lars`` strategy is per
    layer, so the scheduled base rate is reported), and the momentum is ``None`` for optimizers
    without one (the allreduce's, where momentum correction moved it there). Schedules are
    compiled once: eagerly one costs milliseconds a call, compiled tens of microseconds
    (AdaScale's, which reads its state, as the backend compiles a stateful function)."""
    inner = optimizers.unwrapped(optimizer)
    momentum = getattr(inner, "moved_momentum", None) or getattr(inner, "momentum", None)
    backend = backends.current()
    compiled = backend.compiled if adascale_of(optimizer) is None else backend.compiled_stateful
    scheduled = compiled(
        lambda step: (_rate(optimizer, step), momentum(step) if callable(momentum) else 0.0)
    )

    def rates(step: int) -> tuple[float, float | None]:
        rate, scheduled_momentum = scheduled(keras.ops.convert_to_tensor(step, "int32"))
        return float(rate), float(scheduled_momentum) if callable(momentum) else momentum

    return rates


def _rate(optimizer, step):
    optimizer = optimizers.unwrapped(optimizer)
    rate = optimizer.learning_rate
    if isinstance(optimizer._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
        rate = optimizer._learning_rate(step)
    return rate * optimizers.rate_multiplier(optimizer, step + 1)


def schedule_preview(
    config: ExperimentConfig,
    num_train: int,
    world_size: int | None = None,
    points: int = PREVIEW_POINTS,
) -> pd.DataFrame:
    """Learning rate and momentum over the whole run, as training will see them: columns
    ``step``, ``epoch``, ``lr``, ``momentum``; at most ``points`` rows
    (:func:`toolkit.rates.preview_steps`). With AdaScale, the
    base schedule over the base run's updates: training reads it at its clock ``τ`` (``step``
    here) and multiplies it by the gain."""
    plan = RunPlan.of(config, num_train, world_size)
    optimizer = build_optimizer(config, plan)
    if adascale := adascale_of(optimizer):
        optimizer.learning_rate = adascale.schedule
    spe = plan.schedule_steps_per_epoch
    steps = preview_steps(plan, points)
    rates = rates_at(optimizer)
    lr, momentum = zip(*(rates(int(s)) for s in steps), strict=True)
    return pd.DataFrame({"step": steps, "epoch": steps / spe, "lr": lr, "momentum": momentum})
