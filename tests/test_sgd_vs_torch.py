"""The toolkit's SGD against ``torch.optim.SGD``, the independent oracle for its semantics."""

from __future__ import annotations

import itertools

import keras
import numpy as np
import pytest
import torch

from toolkit.optimizers import SGD
from toolkit.optimizers.schedules import MultiFactor

SHAPES = [(7, 5), (5,), (3, 4, 2)]
STEPS = 120


def learning_rate(t: int) -> float:
    """A rate that changes every step, so the lr-times-buffer placement matters."""
    return 0.05 * (1.5 + np.sin(0.3 * t))


def gradients(seed: int):
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(s).astype("float32") for s in SHAPES] for _ in range(STEPS)]


def initial_weights(seed: int):
    rng = np.random.default_rng(seed + 1000)
    return [rng.standard_normal(s).astype("float32") for s in SHAPES]


def run_torch(weights, grads, momentum_at, **hyper):
    params = [torch.nn.Parameter(torch.tensor(w)) for w in weights]
    opt = torch.optim.SGD(params, lr=learning_rate(0), momentum=momentum_at(0), **hyper)
    for t, step_grads in enumerate(grads):
        opt.param_groups[0]["lr"] = learning_rate(t)
        opt.param_groups[0]["momentum"] = momentum_at(t)
        for p, g in zip(params, step_grads):
            p.grad = torch.tensor(g)
        opt.step()
    return [p.detach().numpy() for p in params]


def run_toolkit(weights, grads, momentum, **hyper):
    variables = [keras.Variable(w) for w in weights]
    opt = SGD(learning_rate=learning_rate(0), momentum=momentum, **hyper)
    for t, step_grads in enumerate(grads):
        opt.learning_rate = learning_rate(t)
        opt.apply(step_grads, variables)
    return [keras.ops.convert_to_numpy(v) for v in variables]


VALID = [
    dict(momentum=m, dampening=d, nesterov=n, weight_decay=wd)
    for m, d, n, wd in itertools.product([0.0, 0.9], [0.0, 0.3], [False, True], [0.0, 1e-2])
    if not (n and (m == 0 or d != 0))
]


@pytest.mark.parametrize("hyper", VALID, ids=lambda h: "-".join(f"{k}={v}" for k, v in h.items()))
def test_matches_torch_sgd(hyper):
    seed = hash(tuple(hyper.values())) % 1000
    weights, grads = initial_weights(seed), gradients(seed)
    momentum = hyper.pop("momentum")
    expected = run_torch(weights, grads, lambda t: momentum, **hyper)
    got = run_toolkit(weights, grads, momentum, **hyper)
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=2e-5, atol=2e-6)
    assert not np.allclose(got[0], weights[0])  # the test moved the weights


def test_momentum_schedule_matches_torch_with_momentum_changed_each_step():
    schedule = MultiFactor(base=0.9, steps=[40, 80], factor=0.5)
    weights, grads = initial_weights(7), gradients(7)
    expected = run_torch(
        weights, grads, lambda t: float(schedule(t)), dampening=0.2, weight_decay=1e-3
    )
    got = run_toolkit(weights, grads, schedule, dampening=0.2, weight_decay=1e-3)
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(momentum=-0.1), "momentum"),
        (dict(weight_decay=-1e-4), "weight_decay"),
        (
            dict(nesterov=True),
            "Nesterov momentum requires a momentum and zero dampening",
        ),
        (dict(momentum=0.9, dampening=0.1, nesterov=True), "zero dampening"),
    ],
)
def test_rejects_what_torch_rejects(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SGD(learning_rate=0.1, **kwargs)
    torch_kwargs = {"momentum": 0.0, **kwargs}
    with pytest.raises(ValueError):
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1, **torch_kwargs)
