"""Turn a validated :class:`~toolkit.config.ExperimentConfig` into the objects a run uses.

Training, the app's schedule preview and notebooks all go through these functions, so the rate
a preview shows is the rate training uses. A *step* is one batch per worker (one optimizer
call); ``steps_per_epoch`` counts them for one worker's shard.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np
import pandas as pd
import tensorflow as tf
from keras.optimizers.schedules import CosineDecay, ExponentialDecay, PolynomialDecay

from toolkit import optimizers
from toolkit.config import ConfigError, ExperimentConfig
from toolkit.optimizers.schedules import MultiFactor, Poly, Warmup
from toolkit.scaling.adaptive_batch import BatchPlan
from toolkit.scaling.adascale import AdaScale
from toolkit.training import data, models


def steps_per_epoch(config: ExperimentConfig, num_train: int, world_size: int) -> int:
    """Batches per worker and epoch (capped by ``config.steps_per_epoch``). At a fixed
    ``batch.global_size`` G it is the same on any number of workers W that divides G, as an
    elastic run needs: ``⌊⌊n / W⌋ / (G / W)⌋ = ⌊n / G⌋``. An adaptive batch's epoch is a whole
    number of updates at its largest batch, so at any batch it takes (powers of two): ``⌊n /
    max⌋`` of them, whose examples it then takes at whatever batch it has."""
    per_worker = config.per_worker_batch(world_size)
    steps = data.shard_size(num_train, world_size) // per_worker
    if steps < 1:
        raise ConfigError(
            f"batch.per_worker={per_worker} is larger than each of the "
            f"{world_size} workers' {data.shard_size(num_train, world_size)} training examples"
        )
    if adaptive := config.batch.adaptive:
        most = most_steps_per_update(config, world_size)
        if steps < most:
            raise ConfigError(
                f"batch.adaptive.max={adaptive.max} is larger than the {num_train} training "
                "examples"
            )
        steps -= steps % most
    return min(steps, config.steps_per_epoch or steps)


def batch_plan(config: ExperimentConfig, world_size: int) -> BatchPlan:
    """How the run's steps group into updates, as it starts (an adaptive batch's first)."""
    return BatchPlan(
        config.per_worker_batch(world_size),
        world_size,
        config.steps_per_update(world_size),
        adaptive=config.batch.adaptive is not None,
    )


def load_dataset(config: ExperimentConfig) -> data.Dataset:
    """The configured dataset, generated or split with the run's seed."""
    return data.load(config.dataset.name, seed=config.seed, **config.dataset.params)


def train_batches(
    config: ExperimentConfig,
    dataset: data.Dataset,
    epoch: int,
    world_size: int = 1,
    rank: int = 0,
    last: int | None = None,
) -> tf.data.Dataset:
    """Worker ``rank``'s batches of epochs ``epoch`` to ``last`` (default: ``epoch`` alone):
    its shard of the training set in each epoch's seeded order, :func:`steps_per_epoch`
    batches of its per-worker size, built lazily (:func:`toolkit.training.data.epochs_dataset`)."""
    return data.epochs_dataset(
        dataset.x_train,
        dataset.y_train,
        batch_size=config.per_worker_batch(world_size),
        epochs=range(epoch, epoch + 1 if last is None else last),
        steps_per_epoch=steps_per_epoch(config, len(dataset.x_train), world_size),
        seed=config.seed,
        num_shards=world_size,
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


def learning_rate_schedule(config: ExperimentConfig, steps_per_epoch: int, world_size: int):
    """The learning-rate schedule: the scaled base rate, the named decay, then the warmup."""
    base = config.scaled_learning_rate(world_size)
    total = config.epochs * steps_per_epoch
    params = config.schedule.params
    match config.schedule.name:
        case "constant":
            schedule = base
        case "poly":
            schedule = Poly(base, total, power=params.get("power", 2.0))
        case "polynomial":
            schedule = PolynomialDecay(base, total, **params)
        case "cosine":
            schedule = CosineDecay(base, total, alpha=params.get("alpha", 0.0))
        case "exponential":
            schedule = ExponentialDecay(
                base,
                decay_steps=max(1, round(params.get("decay_epochs", 1) * steps_per_epoch)),
                decay_rate=params.get("decay_rate", 0.1),
                staircase=params.get("staircase", False),
            )
        case "multifactor":
            milestones = [round(e * steps_per_epoch) for e in params.get("epochs", [])]
            schedule = MultiFactor(base, milestones, params.get("factor", 0.1))
    warmup = config.schedule.warmup
    return Warmup(
        schedule,
        warmup_steps=round(warmup.epochs * steps_per_epoch),
        strategy=warmup.strategy,
        initial_multiplier=config.warmup_multiplier(world_size),
    )


def noise_batches(config: ExperimentConfig, world_size: int) -> tuple[int, int]:
    """The two batch sizes ``(b_small, b_big)`` the noise scale is measured at, as the run
    starts (:meth:`~toolkit.scaling.adaptive_batch.BatchPlan.noise_batches`)."""
    return batch_plan(config, world_size).noise_batches()


def base_updates_per_epoch(config: ExperimentConfig, num_train: int) -> int:
    """Updates per epoch of AdaScale's base run, at ``lr_scaling.base_batch``."""
    updates = num_train // config.lr_scaling.base_batch
    if updates < 1:
        raise ConfigError(
            f"lr_scaling.base_batch={config.lr_scaling.base_batch} is larger than the "
            f"{num_train} training examples"
        )
    return updates


def adascale_updates(config: ExperimentConfig, num_train: int) -> int:
    """The base run's updates, which AdaScale's clock ``τ`` counts to: ``epochs`` of
    :func:`base_updates_per_epoch`."""
    return config.epochs * base_updates_per_epoch(config, num_train)


def last_epoch(config: ExperimentConfig, num_train: int, world_size: int) -> int:
    """The epoch a run trains to at most: ``epochs``; with AdaScale, as many as its base run's
    updates take at a gain of 1 (it ends sooner, once ``τ`` has done them), at its largest
    batch if it is adaptive."""
    if config.lr_scaling.rule != "adascale":
        return config.epochs
    steps = adascale_updates(config, num_train) * most_steps_per_update(config, world_size)
    return -(-steps // steps_per_epoch(config, num_train, world_size))


def most_steps_per_update(config: ExperimentConfig, world_size: int) -> int:
    """Steps per update at most: the run's, or an adaptive batch's at its largest."""
    if adaptive := config.batch.adaptive:
        return adaptive.max // (config.per_worker_batch(world_size) * world_size)
    return config.steps_per_update(world_size)


def build_optimizer(
    config: ExperimentConfig, steps_per_epoch: int, world_size: int, num_train: int | None = None
) -> keras.optimizers.Optimizer:
    """The configured optimizer with the scheduled learning rate. LBSGD's
    ``updates_per_epoch`` defaults to the run's real ``steps_per_epoch``. AdaScale's rate
    (``lr_scaling.rule: adascale``) is its base schedule, laid out over the base run's epochs
    of ``num_train`` examples, times its gain (:class:`~toolkit.scaling.adascale.AdaScale`)."""
    params = dict(config.optimizer.params)
    if config.optimizer.name == "lbsgd":
        params.setdefault("updates_per_epoch", steps_per_epoch)
    if config.lr_scaling.rule == "adascale":
        if num_train is None:
            raise ValueError("AdaScale's base schedule needs num_train")
        b_small, b_big = noise_batches(config, world_size)
        learning_rate = AdaScale(
            learning_rate_schedule(config, base_updates_per_epoch(config, num_train), world_size),
            batch=config.global_batch(world_size),
            base_batch=config.lr_scaling.base_batch,
            b_small=b_small,
            b_big=b_big,
            smoothing=config.logging.noise_scale_smoothing,
            total=adascale_updates(config, num_train),
        )
    else:
        learning_rate = learning_rate_schedule(config, steps_per_epoch, world_size)
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
    compiled once: eagerly one costs milliseconds a call, compiled tens of microseconds."""
    inner = optimizers.unwrapped(optimizer)
    momentum = getattr(inner, "moved_momentum", None) or getattr(inner, "momentum", None)
    scheduled = tf.function(
        lambda step: (_rate(optimizer, step), momentum(step) if callable(momentum) else 0.0),
        autograph=False,
    )

    def rates(step: int) -> tuple[float, float | None]:
        rate, scheduled_momentum = scheduled(tf.constant(step, tf.int64))
        return float(rate), float(scheduled_momentum) if callable(momentum) else momentum

    return rates


def _rate(optimizer, step):
    optimizer = optimizers.unwrapped(optimizer)
    rate = optimizer.learning_rate
    if isinstance(optimizer._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
        rate = optimizer._learning_rate(step)
    if isinstance(optimizer, optimizers.LBSGD) and optimizer.warmup_strategy != "lars":
        rate = rate * optimizer.warmup_multiplier(step + 1)
    return rate


def schedule_preview(
    config: ExperimentConfig,
    num_train: int,
    world_size: int | None = None,
    points: int = 400,
) -> pd.DataFrame:
    """Learning rate and momentum over the whole run, as training will see them: columns
    ``step``, ``epoch``, ``lr``, ``momentum``; at most ``points`` rows. With AdaScale, the
    base schedule over the base run's updates: training reads it at its clock ``τ`` (``step``
    here) and multiplies it by the gain."""
    world_size = world_size or config.workers
    spe = steps_per_epoch(config, num_train, world_size)
    optimizer = build_optimizer(config, spe, world_size, num_train)
    if adascale := adascale_of(optimizer):
        optimizer.learning_rate = adascale.schedule
        spe = base_updates_per_epoch(config, num_train)
    total = config.epochs * spe
    steps = np.unique(np.linspace(0, total - 1, min(points, total)).round().astype(int))
    rates = rates_at(optimizer)
    lr, momentum = zip(*(rates(int(s)) for s in steps), strict=True)
    return pd.DataFrame({"step": steps, "epoch": steps / spe, "lr": lr, "momentum": momentum})
