"""The learning rate a run's schedule gives, computed in numpy: the peak that
:mod:`toolkit.advice` checks a warm-up against, known before any process starts and without
TensorFlow.

Training builds its schedule from Keras objects (:mod:`toolkit.optimizers.schedules`,
``training/experiment.py``); this module restates their formulas, and
``tests/test_rates.py`` holds the two equal for every schedule, warm-up, LBSGD's own warm-up
and AdaScale's base schedule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from toolkit.catalog import OPTIMIZERS, SCHEDULES
from toolkit.plan import RunPlan

if TYPE_CHECKING:
    from toolkit.config import ExperimentConfig

PREVIEW_POINTS = 400
"""The steps a schedule preview samples (``experiment.schedule_preview``'s default)."""


def _ramp(strategy: str, progress: np.ndarray) -> np.ndarray:
    return {"linear": progress, "power2": progress**2, "sqrt": np.sqrt(progress)}[strategy]


def _schedule(name: str, base: float, total: int, per_epoch: int, n: np.ndarray, **p):
    """Schedule ``name`` (:data:`toolkit.catalog.SCHEDULES`) at steps ``n``."""
    done = np.minimum(n, total) / total
    if name == "constant":
        return np.full_like(n, base, dtype=float)
    if name == "poly":  # MXNet's, steps left counted first
        return base * ((total - np.minimum(n, total)) / total) ** p["power"]
    if name == "polynomial":
        end = p["end_learning_rate"]
        return (base - end) * (1 - done) ** p["power"] + end
    if name == "cosine":
        return base * ((1 - p["alpha"]) * 0.5 * (1 + np.cos(np.pi * done)) + p["alpha"])
    if name == "exponential":
        exponent = n / max(1, round(p["decay_epochs"] * per_epoch))
        return base * p["decay_rate"] ** (np.floor(exponent) if p["staircase"] else exponent)
    if name == "multifactor":
        milestones = np.array([round(e * per_epoch) for e in p["epochs"]])
        return base * p["factor"] ** (n[:, None] > milestones).sum(axis=1)
    raise ValueError(f"no formula for schedule {name!r}")


def learning_rates(config: ExperimentConfig, plan: RunPlan, steps: np.ndarray) -> np.ndarray:
    """The rate at each 0-based optimizer step in ``steps``, as training applies it: the
    config's schedule over the plan's schedule steps (AdaScale's base run, under AdaScale:
    its clock's rate, before the gain), the warm-up in front, LBSGD's own warm-up multiplier
    after (except its ``lars`` strategy, which is per layer)."""
    n = np.asarray(steps, dtype=float)
    schedule = config.schedule
    rate = _schedule(
        schedule.name,
        plan.learning_rate,
        plan.schedule_steps,
        plan.schedule_steps_per_epoch,
        n,
        **{**SCHEDULES.parameters(schedule.name), **schedule.params},
    )
    if plan.warmup_steps:
        m0 = plan.warmup_multiplier
        ramp = _ramp(schedule.warmup.strategy, np.minimum(n / plan.warmup_steps, 1.0))
        rate = rate * (m0 + (1.0 - m0) * ramp)
    if config.optimizer.name == "lbsgd":
        rate = rate * _lbsgd_multiplier(config, plan, n + 1)
    return rate


def _lbsgd_multiplier(config: ExperimentConfig, plan: RunPlan, calls: np.ndarray) -> np.ndarray:
    """``LBSGD.warmup_multiplier`` after ``calls`` calls (1-based)."""
    p = {**OPTIMIZERS.parameters("lbsgd"), "updates_per_epoch": plan.steps_per_epoch}
    p.update(config.optimizer.params)
    if p["warmup_strategy"] == "lars":
        return np.ones_like(calls)
    total = p["warmup_epochs"] * p["updates_per_epoch"]
    if total <= 1:
        return np.full_like(calls, float(p["batch_scale"]))
    progress = np.minimum((calls + p["begin_epoch"] * p["updates_per_epoch"]) / total, 1.0)
    return 1.0 + (p["batch_scale"] - 1.0) * _ramp(p["warmup_strategy"], progress)


def preview_steps(plan: RunPlan, points: int = PREVIEW_POINTS) -> np.ndarray:
    """The steps a schedule preview samples: ``points`` spread evenly over the run's schedule
    steps, rounded, each once."""
    total = plan.schedule_steps
    return np.unique(np.linspace(0, total - 1, min(points, total)).round().astype(int))


def peak_learning_rate(config: ExperimentConfig, num_train: int) -> float:
    """The highest rate at the preview's steps (:func:`preview_steps`), so the peak a warning
    tells is the one the Launch form's chart shows."""
    plan = RunPlan.of(config, num_train)
    return float(learning_rates(config, plan, preview_steps(plan)).max())
