"""AdaScale's gain and state (Johnson et al. 2020) against oracles written out here, on whichever
Keras backend runs the tests (test_every_backend.py runs them on JAX and PyTorch too): the
paper's formula for the gain of known estimates and its clipping to ``[1, S]``; on a quadratic
whose ``Σ`` and ``G`` are known, the gain measured from the noise meter's two norms converging
to the formula; and a numpy model of Algorithm 1, update by update (test_adascale.py holds real
runs to it)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from conftest import as_in_training

from toolkit.optimizers.schedules import Warmup
from toolkit.scaling.adascale import AdaScale, gain_of, state_dtype

# float64 (1e-12) where the backend has it; float32 on JAX without jax_enable_x64
TOLERANCE = 1e-12 if state_dtype() == "float64" else 1e-6


def formula(grad_sq, trace_sigma, base_batch, batch):
    """The paper's gain, with ``σ²`` the base batch's gradient variance ``tr Σ / B0``."""
    sigma_sq, scale = trace_sigma / base_batch, batch / base_batch
    return (sigma_sq + grad_sq) / (sigma_sq / scale + grad_sq)


@pytest.mark.parametrize("b_simple", [0.5, 16.0, 100.0, 5000.0])
@pytest.mark.parametrize("base_batch, batch", [(32, 32), (16, 256), (8, 1024)])
def test_the_gain_is_the_formula_of_the_true_gradient_and_noise(b_simple, base_batch, batch):
    grad_sq = 0.7
    trace = b_simple * grad_sq
    got = float(gain_of(grad_sq, trace, base_batch, batch))
    assert got == pytest.approx(formula(grad_sq, trace, base_batch, batch), rel=TOLERANCE)
    assert got == pytest.approx((1 + b_simple / base_batch) / (1 + b_simple / batch), rel=TOLERANCE)
    assert 1 <= got <= batch / base_batch


def test_the_gain_stays_in_one_to_s_whatever_the_estimates():
    scale = 256 / 16
    assert float(gain_of(0.0, 5.0, 16, 256)) == scale  # all noise: worth S small steps
    assert float(gain_of(-1e-3, 5.0, 16, 256)) == scale  # a noisy |G|² below zero
    assert float(gain_of(2.0, 0.0, 16, 256)) == 1.0  # no noise: worth one
    assert float(gain_of(2.0, -3.0, 16, 256)) == 1.0  # a noisy tr Σ below zero
    assert float(gain_of(-5.0, 1.0, 16, 256)) == scale  # below zero altogether


def test_on_a_quadratic_with_known_noise_the_measured_gain_converges_to_the_formula():
    """``f_i(w) = ½|w − x_i|²`` with ``x_i ~ N(μ, diag(s²))``: each example's gradient is
    ``w − x_i``, so ``G = w − μ`` and ``tr Σ = Σ s²``. Eight workers' batches of 32 are drawn
    at fixed ``w`` and fed to AdaScale as the allreduce hook would (the mean of the workers'
    own norms², the norm² of their mean)."""
    rng = np.random.default_rng(0)
    dim, workers, b_small, base_batch = 50, 8, 32, 16
    mu, scales = rng.normal(size=dim), rng.uniform(0.5, 1.5, size=dim)
    w = mu + 0.1 * rng.normal(size=dim)
    grad_sq, trace = float((w - mu) @ (w - mu)), float((scales**2).sum())
    batch = workers * b_small
    adascale = AdaScale(
        0.1, batch=batch, base_batch=base_batch, b_small=b_small, b_big=batch, smoothing=0.998
    )
    observe = as_in_training(adascale.observe)
    for _ in range(4000):
        x = mu + scales * rng.normal(size=(workers, b_small, dim))
        local = (w - x).mean(axis=1)
        observe((local**2).sum(axis=1).mean(), (local.mean(axis=0) ** 2).sum())
    assert 20 < trace / grad_sq < 2000  # a gain well inside (1, S)
    expected = formula(grad_sq, trace, base_batch, batch)
    assert float(adascale.gain.numpy()) == pytest.approx(expected, rel=0.05)


def test_adascale_serialises_with_its_base_schedule():
    rate = AdaScale(Warmup(0.1, 10), batch=256, base_batch=32, b_small=128, b_big=256)
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(rate))
    assert again.get_config() == rate.get_config() and again.scale == 8


def numpy_adascale(small, big, *, b_small, b_big, base_batch, batch, decay, base_rate):
    """Algorithm 1 of Johnson et al. in numpy, with the lab's noise estimates: for each update's
    two measured norms², the gain, the rate it applies and the clock after it. The batch sizes
    may be numbers or one per update (an adaptive batch's)."""
    updates = len(small)
    b_small, b_big, batch = (np.broadcast_to(v, updates) for v in (b_small, b_big, batch))
    grad_avg = trace_avg = tau = 0.0
    gains, rates, taus = [], [], []
    for n, (s, b) in enumerate(zip(small, big, strict=True), start=1):
        b_s, b_b, scale = b_small[n - 1], b_big[n - 1], batch[n - 1] / base_batch
        grad_sq = (b_b * b - b_s * s) / (b_b - b_s)
        trace = (s - b) / (1 / b_s - 1 / b_b)
        grad_avg = decay * grad_avg + (1 - decay) * grad_sq
        trace_avg = decay * trace_avg + (1 - decay) * trace
        g, t = grad_avg / (1 - decay**n), max(trace_avg / (1 - decay**n), 0.0)
        below = t / batch[n - 1] + g
        gain = min(max((t / base_batch + g) / below, 1.0), scale) if below > 0 else scale
        gains.append(gain)
        rates.append(gain * base_rate(tau))
        tau += gain
        taus.append(tau)
    return np.array(gains), np.array(rates), np.array(taus)


def test_update_by_update_it_is_the_numpy_model_of_algorithm_1():
    """Random norms² (a noisy ``|G|²`` below zero now and then), a warmup base schedule: every
    update's gain, rate and clock are the model's, and the state keeps the backend's dtype."""
    rng = np.random.default_rng(4)
    big = rng.uniform(0.05, 1.0, size=60)
    small = big + rng.uniform(-0.1, 2.0, size=60)
    shape = {"b_small": 32, "b_big": 256, "base_batch": 16, "batch": 256}
    adascale = AdaScale(Warmup(0.4, 25), smoothing=0.9, **shape)
    gains, rates, taus = numpy_adascale(
        small, big, decay=0.9, base_rate=lambda tau: 0.4 * min(tau / 25, 1.0), **shape
    )
    observe = as_in_training(adascale.observe)
    for n, (s, b) in enumerate(zip(small, big, strict=True)):
        observe(s, b)
        rate = float(adascale(n))  # the step is not read: the clock is
        assert float(adascale.gain.numpy()) == pytest.approx(gains[n], rel=TOLERANCE)
        assert float(adascale.tau.numpy()) == pytest.approx(taus[n], rel=TOLERANCE)
        assert rate == pytest.approx(rates[n], rel=1e-6)  # the rate is float32, as Keras's
    assert gains.min() == 1.0 or gains.min() < gains.max()  # the model was not trivial
    assert {keras.backend.standardize_dtype(v.dtype) for v in adascale.variables} == {state_dtype()}
