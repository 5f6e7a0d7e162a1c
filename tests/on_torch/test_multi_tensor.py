"""The multi-tensor update (``toolkit/optimizers/multi_tensor.py``) against the per-variable
update it replaces on PyTorch, which the oracle tests hold to torch and to numpy: the same
weights, slots and applied trust ratios after several updates, to float32's rounding (PyTorch's
fused kernel and ``_foreach_norm`` order their arithmetic otherwise, so not bit for bit).

Collected only with ``KERAS_BACKEND=torch`` (``tests/conftest.py``); ``test_every_backend``
runs it there. Cost: about 3 s."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from toolkit.optimizers import LARS, LBSGD, SGD
from toolkit.optimizers.schedules import Warmup

STEPS = 5


def momentum_schedule(step):
    return 0.5 + 0.4 * keras.ops.minimum(keras.ops.cast(step, "float32") / 3.0, 1.0)


def decay_schedule(step):
    return 1e-3 / (1.0 + keras.ops.cast(step, "float32"))


CASES = {
    "sgd": lambda: SGD(0.1),
    "sgd momentum": lambda: SGD(0.1, momentum=0.9),
    "sgd nesterov decay": lambda: SGD(0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "sgd dampening": lambda: SGD(0.1, momentum=0.9, dampening=0.3, weight_decay=1e-3),
    "sgd schedules": lambda: SGD(
        Warmup(0.2, warmup_steps=3),
        momentum=momentum_schedule,
        dampening=0.1,
        weight_decay=decay_schedule,
    ),
    "lars": lambda: LARS(1.0, momentum=0.9, weight_decay=5e-4, trust_coefficient=0.02),
    "larc nesterov": lambda: LARS(1.0, weight_decay=5e-4, clip=True, nesterov=True),
    "lars no momentum, every variable": lambda: LARS(
        0.5, momentum=0.0, epsilon=1e-6, exclude_from_layer_adaptation=[]
    ),
    "lars by pattern, schedules": lambda: LARS(
        Warmup(1.0, warmup_steps=2),
        momentum=momentum_schedule,
        weight_decay=decay_schedule,
        exclude_from_layer_adaptation=["bias"],
    ),
    "lbsgd linear": lambda: LBSGD(0.1, momentum=0.9, weight_decay=5e-4, warmup_epochs=1),
    "lbsgd sqrt, accumulating": lambda: LBSGD(
        0.1, momentum=0.9, weight_decay=5e-4, warmup_strategy="sqrt", batch_scale=2
    ),
    "lbsgd lars": lambda: LBSGD(0.1, momentum=0.9, weight_decay=5e-4, warmup_strategy="lars"),
    "lbsgd lars, accumulating": lambda: LBSGD(
        0.1, momentum=0.9, warmup_strategy="lars", batch_scale=3, updates_per_epoch=2
    ),
}


def model() -> keras.Model:
    """A conv net's variables: kernels of 2 and 4 dimensions, biases, a normalisation's."""
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            keras.layers.Conv2D(4, 3, name="conv"),
            keras.layers.BatchNormalization(name="norm"),
            keras.layers.Flatten(),
            keras.layers.Dense(5, name="dense"),
        ],
        name="net",
    )


def trained(make, multi_tensor: bool, gradients, norms=None):
    """Weights, optimizer slots and applied ratios after ``gradients`` (one list per call),
    with ``norms`` given as the gradients' norms of every call when not ``None``."""
    net = model()
    optimizer = make()
    optimizer.multi_tensor = multi_tensor
    optimizer.build(net.trainable_variables)
    for grads in gradients:
        if norms is not None:
            optimizer.use_gradient_norms(norms)
        optimizer.apply(grads, net.trainable_variables)
    ratios = optimizer.applied_trust_ratios() if optimizer.applies_trust_ratios else {}
    slots = [v.numpy() for v in optimizer.variables]
    return [v.numpy() for v in net.trainable_variables] + slots, ratios


def gradients_for(calls: int, scale=1e-2):
    rng = np.random.default_rng(1)
    shapes = [v.shape for v in model().trainable_variables]
    return [
        [(scale * rng.standard_normal(shape)).astype("float32") for shape in shapes]
        for _ in range(calls)
    ]


def assert_same(fast, reference):
    """Equal to float32's rounding: each element within 2e-6 of itself or 1e-6 of its tensor's
    largest magnitude (8 units in the last place there): an update rounds relative to its own
    size, which beside a small weight can be large (measured: 1.4e-7 on a weight of 0.013
    whose tensor reaches 0.35, LBSGD's ``lars`` warm-up, after 15 updates)."""
    (fast_values, fast_ratios), (values, ratios) = fast, reference
    for got, want in zip(fast_values, values, strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6 * np.abs(want).max())
    assert fast_ratios.keys() == ratios.keys()
    np.testing.assert_allclose(list(fast_ratios.values()), list(ratios.values()), rtol=2e-6)


@pytest.mark.parametrize("case", CASES)
def test_the_multi_tensor_update_equals_the_per_variable_one(case):
    gradients = gradients_for(STEPS * 3)
    fast = trained(CASES[case], True, gradients)
    assert_same(fast, trained(CASES[case], False, gradients))
    assert not np.array_equal(fast[0][0], model().trainable_variables[0].numpy())


@pytest.mark.parametrize("case", ["lars", "lbsgd lars"])
def test_given_gradient_norms_are_the_ones_the_ratios_use(case):
    gradients = gradients_for(STEPS)
    norms = [10.0 * float(np.linalg.norm(g)) for g in gradients[0]]
    fast = trained(CASES[case], True, gradients, norms)
    assert_same(fast, trained(CASES[case], False, gradients, norms))
    unnormed = trained(CASES[case], True, gradients)
    assert fast[1] != unnormed[1]


def test_the_multi_tensor_update_runs_no_per_variable_step(monkeypatch):
    def refuse(*args):
        raise AssertionError("update_step ran")

    for make in CASES.values():
        monkeypatch.setattr(type(make()), "update_step", refuse)
    for case in CASES:
        trained(CASES[case], True, gradients_for(3))
    with pytest.raises(AssertionError, match="update_step ran"):
        trained(CASES["lars"], False, gradients_for(1))


def test_a_momentum_schedule_at_zero_still_moves_the_velocities():
    """PyTorch's kernel keeps no buffer at momentum 0; that update takes the per-variable
    path, and the velocity it leaves is the one the next update starts from."""
    gradients = gradients_for(4)

    def make():
        return LARS(1.0, momentum=lambda step: keras.ops.where(step == 1, 0.0, 0.9))

    assert_same(trained(make, True, gradients), trained(make, False, gradients))


def test_trust_ratios_are_computed_as_the_update_computes_them():
    net = model()
    optimizer = CASES["lars"]()
    optimizer.build(net.trainable_variables)
    (grads,) = gradients_for(1)
    before = optimizer.trust_ratios(grads, net.trainable_variables)
    optimizer.apply(grads, net.trainable_variables)
    assert optimizer.applied_trust_ratios() == before
