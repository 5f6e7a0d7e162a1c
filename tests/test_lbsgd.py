"""LBSGD against MXNet's large-batch SGD (PR #8918) written out independently in numpy."""

from __future__ import annotations

import contextlib
import math

import keras
import numpy as np
import pytest
from conftest import as_in_training

from toolkit.optimizers import LBSGD


def multiplier(strategy, n, warmup_updates, batch_scale):
    """MXNet ``LBSGD._get_lbmult``."""
    if n >= warmup_updates:
        return float(batch_scale)
    if warmup_updates <= 1:
        return 1.0
    p = n / warmup_updates
    ramp = {"linear": p, "power2": p * p, "sqrt": math.sqrt(p)}[strategy]
    return 1.0 + (batch_scale - 1) * ramp


def lbsgd_reference(
    w,
    grads,
    lr,
    *,
    momentum,
    wd,
    strategy,
    warmup_epochs,
    upe,
    batch_scale,
    begin_epoch=0,
):
    """MXNet ``LBSGD.update`` for one variable: accumulate, then ``sgd_mom_update``."""
    w = w.astype(np.float64)
    mom = np.zeros_like(w)
    cumulated = np.zeros_like(w)
    num_cums = begin_epoch * upe
    for call, g in enumerate(grads):
        num_cums += 1
        cumulated = cumulated + g
        if num_cums % batch_scale:
            continue
        g = cumulated / batch_scale
        cumulated = np.zeros_like(w)
        if strategy == "lars":
            w2, g2 = np.sum(w * w), np.sum(g * g)
            mult = min(max(math.sqrt(w2 / (g2 + wd * w2 + 1e-18)), 0.01), 100)
        else:
            mult = multiplier(strategy, num_cums, warmup_epochs * upe, batch_scale)
        mom = momentum * mom - lr(call) * mult * (g + wd * w)
        w = w + mom
    return w


def lr(call):
    return 0.05 * 0.99**call


class DecaySchedule(keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
        return 0.05 * keras.ops.power(0.99, keras.ops.cast(step, "float32"))


def eager_branches():
    """On JAX, Keras's accumulation branches taken in Python (``jax.disable_jit``): eagerly,
    each call otherwise compiles its ``lax.cond`` anew (30 s for these 48 calls). The compiled
    form, both branches run, is test_a_compiled_accumulating_update's and a real run's."""
    if keras.backend.backend() != "jax":
        return contextlib.nullcontext()
    import jax

    return jax.disable_jit()


@pytest.mark.parametrize("strategy", ["linear", "power2", "sqrt", "lars"])
@pytest.mark.parametrize("batch_scale", [1, 4])
def test_matches_mxnet_update(strategy, batch_scale):
    rng = np.random.default_rng(batch_scale)
    shapes = [(5, 3), (3,)]
    initial = [rng.standard_normal(s).astype("float32") for s in shapes]
    calls = 48
    grads = [[rng.standard_normal(s).astype("float32") for s in shapes] for _ in range(calls)]
    variables = [keras.Variable(w) for w in initial]
    options = dict(
        momentum=0.9,
        weight_decay=1e-3,
        warmup_strategy=strategy,
        warmup_epochs=2,
        updates_per_epoch=12,
        batch_scale=batch_scale,
    )
    opt = LBSGD(learning_rate=DecaySchedule(), **options)
    with eager_branches():
        for step_grads in grads:
            opt.apply(step_grads, variables)
    assert int(opt.iterations) == calls // batch_scale
    for i, v in enumerate(variables):
        expected = lbsgd_reference(
            initial[i],
            [g[i] for g in grads],
            lr,
            momentum=0.9,
            wd=1e-3,
            strategy=strategy,
            warmup_epochs=2,
            upe=12,
            batch_scale=batch_scale,
        )
        # atol: float32's rounding over 48 updates of values near 5, in whatever order the
        # backend's compiler (XLA on JAX) fuses the operations
        np.testing.assert_allclose(keras.ops.convert_to_numpy(v), expected, rtol=2e-5, atol=2e-6)


def test_batch_scale_four_is_one_step_on_the_mean_of_four_gradients():
    rng = np.random.default_rng(11)
    w0 = rng.standard_normal((4, 4)).astype("float32")
    grads = [rng.standard_normal((4, 4)).astype("float32") for _ in range(4)]
    variable = keras.Variable(w0)
    opt = LBSGD(
        learning_rate=0.1,
        momentum=0.9,
        weight_decay=0.01,
        warmup_epochs=0,
        batch_scale=4,
    )
    for g in grads[:3]:
        opt.apply([g], [variable])
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), w0)
    opt.apply([grads[3]], [variable])
    mean = np.mean(grads, axis=0, dtype=np.float64)
    expected = w0 - 0.1 * 4 * (mean + 0.01 * w0)  # after warmup the multiplier is batch_scale
    np.testing.assert_allclose(keras.ops.convert_to_numpy(variable), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", ["linear", "power2", "sqrt"])
@pytest.mark.parametrize("n", [1, 25, 50, 99, 100, 101, 500])
def test_warmup_multiplier_at_the_ends_and_middle(strategy, n):
    opt = LBSGD(warmup_strategy=strategy, warmup_epochs=4, updates_per_epoch=25, batch_scale=8)
    assert float(opt.warmup_multiplier(n)) == pytest.approx(multiplier(strategy, n, 100, 8), 1e-6)


def test_begin_epoch_resumes_the_warmup_position():
    fresh = LBSGD(warmup_epochs=4, updates_per_epoch=10, batch_scale=8)
    resumed = LBSGD(warmup_epochs=4, updates_per_epoch=10, batch_scale=8, begin_epoch=2)
    assert float(resumed.warmup_multiplier(5)) == pytest.approx(float(fresh.warmup_multiplier(25)))
    assert float(resumed.warmup_multiplier(5)) == pytest.approx(multiplier("linear", 25, 40, 8))


def test_begin_epoch_in_the_update():
    rng = np.random.default_rng(5)
    w0 = rng.standard_normal((3, 3)).astype("float32")
    grads = [rng.standard_normal((3, 3)).astype("float32") for _ in range(12)]
    variable = keras.Variable(w0)
    opt = LBSGD(
        learning_rate=DecaySchedule(),
        momentum=0.5,
        warmup_epochs=3,
        updates_per_epoch=8,
        batch_scale=2,
        begin_epoch=1,
    )
    for g in grads:
        opt.apply([g], [variable])
    expected = lbsgd_reference(
        w0,
        grads,
        lr,
        momentum=0.5,
        wd=0.0,
        strategy="linear",
        warmup_epochs=3,
        upe=8,
        batch_scale=2,
        begin_epoch=1,
    )
    np.testing.assert_allclose(keras.ops.convert_to_numpy(variable), expected, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(warmup_strategy="cosine"),
            "warmup_strategy.*'linear', 'power2', 'sqrt', 'lars'",
        ),
        (dict(batch_scale=0), "batch_scale"),
        (dict(batch_scale=2.5), "batch_scale"),
        (dict(updates_per_epoch=0), "updates_per_epoch"),
        (dict(warmup_epochs=-1), "warmup_epochs"),
        (dict(gradient_accumulation_steps=4), "batch_scale"),
    ],
)
def test_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LBSGD(**kwargs)


def test_the_lars_multipliers_of_the_latest_update_are_kept_for_logging():
    rng = np.random.default_rng(6)
    variables = [keras.Variable(rng.standard_normal(s).astype("float32")) for s in ((5, 2), (2,))]
    opt = LBSGD(warmup_strategy="lars", momentum=0.9, weight_decay=1e-4)
    opt.build(variables)
    for _ in range(2):
        grads = [rng.standard_normal(v.shape).astype("float32") for v in variables]
        expected = opt.trust_ratios(grads, variables)  # before the update moves w
        opt.apply(grads, variables)
        assert opt.applied_trust_ratios() == expected and len(expected) == 2
    with pytest.raises(ValueError, match="applies no trust ratios"):
        LBSGD(warmup_strategy="linear").applied_trust_ratios()


def test_a_compiled_accumulating_update_keeps_the_multipliers_of_the_mean_gradient():
    rng = np.random.default_rng(8)
    variables = [keras.Variable(rng.standard_normal(s).astype("float32")) for s in ((4, 2), (2,))]
    opt = LBSGD(warmup_strategy="lars", weight_decay=1e-4, batch_scale=2)
    opt.build(variables)
    step = as_in_training(lambda grads: opt.apply(grads, variables))
    calls = [[rng.standard_normal(v.shape).astype("float32") for v in variables] for _ in range(2)]
    step(calls[0])  # accumulated only: nothing applied yet
    assert all(np.isnan(r) for r in opt.applied_trust_ratios().values())
    expected = opt.trust_ratios([(a + b) / 2 for a, b in zip(*calls, strict=True)], variables)
    step(calls[1])
    assert opt.applied_trust_ratios() == pytest.approx(expected, rel=1e-6)
