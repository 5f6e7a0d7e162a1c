"""The learning rates toolkit.rates computes in numpy, without TensorFlow, are the ones training
applies: checked against ``experiment.schedule_preview``, which builds the run's Keras
optimizer and reads its compiled schedule, for every schedule, warm-up strategy, LBSGD's own
warm-up and AdaScale's base schedule. (About 10 s: one Keras optimizer per case.)"""

from __future__ import annotations

import numpy as np
import pytest

from toolkit import rates
from toolkit.catalog import SCHEDULES
from toolkit.config import from_mapping
from toolkit.plan import RunPlan
from toolkit.training.experiment import schedule_preview

NUM_TRAIN = 1000
SCHEDULE_PARAMS = {
    "exponential": [{"decay_epochs": 0.5, "staircase": True}, {"decay_rate": 0.5}],
    "multifactor": [{"epochs": [1, 2.5], "factor": 0.5}],
    "polynomial": [{"power": 2.0, "end_learning_rate": 0.01}],
    "poly": [{"power": 1.5}],
    "cosine": [{"alpha": 0.1}],
}


def config(schedule="cosine", params=None, warmup=None, optimizer=None, **fields):
    return from_mapping(
        {
            "optimizer": optimizer or {"name": "sgd", "learning_rate": 0.1},
            "schedule": {"name": schedule, "params": params or {}, "warmup": warmup or {}},
            "batch": {"per_worker": 50},
            "workers": 2,
            "epochs": 5,
            "lr_scaling": {"rule": "linear", "base_batch": 50},
            **fields,
        }
    )


CASES = {
    **{
        f"{name} {params}": config(name, params)
        for name in SCHEDULES
        for params in SCHEDULE_PARAMS.get(name, [{}])
        if not (name == "multifactor" and not params)
    },
    **{
        f"cosine, {strategy} warm-up": config(
            warmup={"epochs": 2, "strategy": strategy, "initial_multiplier": 0.25}
        )
        for strategy in ("linear", "power2", "sqrt")
    },
    "warm-up cut short": config(warmup={"epochs": 4}),
    "from the unscaled rate": config("poly", warmup={"epochs": 1, "from_unscaled": True}),
    **{
        f"lbsgd {strategy}": config(
            "constant",
            optimizer={
                "name": "lbsgd",
                "learning_rate": 0.1,
                "params": {"batch_scale": 4, "warmup_epochs": 2, "warmup_strategy": strategy},
            },
            batch={"global_size": 400},
        )
        for strategy in ("linear", "power2", "sqrt", "lars")
    },
    "lbsgd mid-warm-up": config(
        "exponential",
        optimizer={
            "name": "lbsgd",
            "learning_rate": 0.1,
            "params": {"batch_scale": 2, "warmup_epochs": 3, "begin_epoch": 1},
        },
        batch={"global_size": 200},
    ),
    "adascale": config(warmup={"epochs": 1}, lr_scaling={"rule": "adascale", "base_batch": 25}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_numpy_rates_are_the_ones_training_applies(case):
    cfg = CASES[case]
    preview = schedule_preview(cfg, NUM_TRAIN, points=10**6)  # every step
    plan = RunPlan.of(cfg, NUM_TRAIN)
    computed = rates.learning_rates(cfg, plan, preview["step"].to_numpy())
    np.testing.assert_allclose(computed, preview["lr"], rtol=2e-6, atol=1e-8)  # float32 near 0


def test_the_peak_is_the_previews_at_its_steps():
    cfg = CASES["warm-up cut short"]
    preview = schedule_preview(cfg, NUM_TRAIN)
    assert rates.preview_steps(RunPlan.of(cfg, NUM_TRAIN)).tolist() == preview["step"].tolist()
    assert rates.peak_learning_rate(cfg, NUM_TRAIN) == pytest.approx(preview["lr"].max(), 1e-6)
    assert rates.peak_learning_rate(cfg, NUM_TRAIN) < 0.95 * 0.2  # cut short: advice tells it
