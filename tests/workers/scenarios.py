"""Shared by the 2-worker script and the single-process reference in test_distributed.py."""

from __future__ import annotations

import keras
import numpy as np

from toolkit import distributed

GLOBAL_BATCH = 32
STEPS = 5


def global_data(n: int = 512):
    rng = np.random.default_rng(42)
    x = rng.standard_normal((n, 12)).astype("float32")
    y = (x[:, :4].sum(axis=1) > 0).astype("int32")
    return x, y


def make_model(seed: int, optimizer, **wrap) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((12,)),
            keras.layers.Dense(16, activation="tanh"),
            keras.layers.Dense(2),
        ]
    )
    model.compile(
        optimizer=distributed.DistributedOptimizer(optimizer, **wrap),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    return model


SCENARIOS = {
    "sgd": dict(optimizer=lambda: keras.optimizers.SGD(0.5), wrap={}, steps=STEPS),
    "accumulate2": dict(
        optimizer=lambda: keras.optimizers.SGD(0.5),
        wrap={"backward_passes_per_step": 2},
        steps=2 * STEPS,
    ),
    "fp16": dict(
        optimizer=lambda: keras.optimizers.SGD(0.5),
        wrap={"compression": "fp16"},
        steps=STEPS,
    ),
}
