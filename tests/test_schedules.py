"""Every schedule against its published formula, written out independently, and the one table
of the schedules a config can name."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest

from toolkit.catalog import SCHEDULES
from toolkit.optimizers import schedules
from toolkit.optimizers.schedules import MultiFactor, Poly, Warmup


def value(schedule, step):
    """A schedule's (or a constant's) value at ``step``."""
    return float(keras.ops.convert_to_numpy(schedules.value_at(schedule, step)))


@pytest.mark.parametrize("step", [0, 1, 49, 50, 51, 99, 100, 150, 151, 400])
def test_multifactor(step):
    expected = 0.8 * 0.1 ** sum(step > s for s in (50, 100, 150))
    assert value(MultiFactor(0.8, [50, 100, 150], 0.1), step) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("power", [1.0, 2.0, 0.5])
@pytest.mark.parametrize("step", [0, 10, 500, 999, 1000, 1001, 5000])
def test_poly(power, step):
    expected = 0.4 * (1 - step / 1000) ** power if step <= 1000 else 0.0
    assert value(Poly(0.4, 1000, power), step) == pytest.approx(
        expected, rel=1e-5, abs=1e-7
    )  # float32 round-off


RAMPS = {"linear": lambda p: p, "power2": lambda p: p * p, "sqrt": math.sqrt}


@pytest.mark.parametrize("strategy", sorted(RAMPS))
@pytest.mark.parametrize("step", [0, 1, 20, 40, 79, 80, 81, 300])
def test_warmup_over_staircase_exponential(strategy, step):
    inner = keras.optimizers.schedules.ExponentialDecay(3.2, 100, 0.5, staircase=True)
    schedule = Warmup(inner, warmup_steps=80, strategy=strategy, initial_multiplier=0.125)
    base = 3.2 * 0.5 ** (step // 100)
    progress = min(step / 80, 1.0)
    expected = base * (0.125 + 0.875 * RAMPS[strategy](progress))
    assert value(schedule, step) == pytest.approx(expected, rel=1e-6)


def test_goyal_gradual_warmup_reaches_k_times_the_rate():
    """Goyal et al.: from lr to k*lr over the warmup, then the k*lr step schedule."""
    k, lr, warmup = 8, 0.1, 50
    schedule = Warmup(MultiFactor(k * lr, [300], 0.1), warmup, "linear", 1 / k)
    assert value(schedule, 0) == pytest.approx(lr)
    assert value(schedule, warmup // 2) == pytest.approx((lr + k * lr) / 2)
    assert value(schedule, warmup) == pytest.approx(k * lr)
    assert value(schedule, 301) == pytest.approx(k * lr * 0.1)


def test_warmup_of_a_constant():
    assert value(Warmup(0.5, 10), 5) == pytest.approx(0.25)
    assert value(Warmup(0.5, 0), 0) == pytest.approx(0.5)


BY_NAME = [  # base rate 1, a run of 100 steps, epochs of 10
    ("constant", {}, lambda n: 1.0),
    ("poly", {"power": 2.0}, lambda n: (1 - min(n, 100) / 100) ** 2),
    ("polynomial", {"end_learning_rate": 0.1}, lambda n: 0.9 * (1 - min(n, 100) / 100) + 0.1),
    (
        "cosine",
        {"alpha": 0.1},
        lambda n: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(n, 100) / 100)),
    ),
    ("exponential", {"decay_epochs": 1, "decay_rate": 0.5}, lambda n: 0.5 ** (n / 10)),
    (
        "exponential",
        {"decay_epochs": 2, "decay_rate": 0.5, "staircase": True},
        lambda n: 0.5 ** (n // 20),
    ),
    (
        "multifactor",
        {"epochs": [1, 2.5], "factor": 0.5},
        lambda n: 0.5 ** sum(n > s for s in (10, 25)),
    ),
]


@pytest.mark.parametrize("name, params, formula", BY_NAME, ids=[case[0] for case in BY_NAME])
def test_every_schedule_a_config_names_by_its_formula(name, params, formula):
    """What ``schedule.name`` builds (lengths in epochs become steps), against the formula."""
    schedule = schedules.get(name, 1.0, total_steps=100, steps_per_epoch=10, **params)
    for n in (0, 7, 10, 15, 20, 25, 26, 50, 100, 200):
        assert value(schedule, n) == pytest.approx(formula(n), rel=1e-5, abs=1e-7)


def test_the_config_names_the_table_and_every_name_is_tested():
    """One table: the config's choices are its names, in its order, and each has a formula
    above (a schedule added to the catalog without one fails here)."""
    from toolkit import config

    enum = config.json_schema()["$defs"]["ScheduleConfig"]["properties"]["name"]["enum"]
    assert enum == list(SCHEDULES)
    assert {name for name, _, _ in BY_NAME} == set(SCHEDULES)


@pytest.mark.parametrize(
    "schedule",
    [
        Poly(0.1, 100, 2.0),
        MultiFactor(0.1, [10, 20], 0.5),
        Warmup(MultiFactor(0.1, [10, 20], 0.5), 5, "sqrt", 0.1),
        Warmup(keras.optimizers.schedules.CosineDecay(1.0, 100), 20, "power2"),
    ],
)
def test_serialization_round_trip(schedule):
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert type(restored) is type(schedule)
    assert restored.get_config() == schedule.get_config()
    steps = np.arange(0, 120, 7)
    np.testing.assert_allclose(
        [value(restored, s) for s in steps], [value(schedule, s) for s in steps]
    )


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: Warmup(0.1, 10, "cosine"), "'linear', 'power2', 'sqrt'"),
        (lambda: Warmup(0.1, 10, initial_multiplier=2.0), "initial_multiplier"),
        (lambda: MultiFactor(0.1, [20, 10]), "strictly increasing"),
        (lambda: MultiFactor(0.1, [10], factor=2.0), "factor"),
        (lambda: Poly(0.1, 0), "max_update"),
        (
            lambda: schedules.get("triangle", 0.1, 100, 10),
            "unknown schedule 'triangle'; choose one of",
        ),
        (
            lambda: schedules.get("poly", 0.1, 100, 10, max_updates=10),
            "no parameter 'max_updates'",
        ),
        (lambda: schedules.get("multifactor", 0.1, 100, 10), "needs the parameter 'epochs'"),
    ],
)
def test_validation(build, message):
    with pytest.raises(ValueError, match=message):
        build()
