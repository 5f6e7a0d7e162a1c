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

from toolkit import optimizer_rules
from toolkit.catalog import SCHEDULES
from toolkit.plan import RunPlan

if TYPE_CHECKING:
    from toolkit.config import ExperimentConfig

PREVIEW_POINTS = 400
"""The steps a schedule preview samples (``experiment.schedule_preview``'s default)."""


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
    its clock's rate, before the gain), the warm-up in front, the optimizer's own warm-up
    multiplier after (:func:`toolkit.optimizer_rules.rate_multiplier`: LBSGD's)."""
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
        ramp = optimizer_rules.ramp(
            schedule.warmup.strategy, np.minimum(n / plan.warmup_steps, 1.0)
        )
        rate = rate * (m0 + (1.0 - m0) * ramp)
    optimizer = config.optimizer
    own = optimizer_rules.rate_multiplier(optimizer.name, optimizer.params, plan.steps_per_epoch)
    return rate if own is None else rate * own(n + 1)


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
