"""The fused CPU kernels (``toolkit/optimizers/fused_kernels.cc``): built by the set-up, used by
the optimizers, equal to TensorFlow's unfused ops bit for bit, and the trust ratio equal to its
formula written out in numpy."""

from __future__ import annotations

import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import ROOT

from toolkit import optimizers
from toolkit.optimizers import kernels
from toolkit.optimizers.trust_ratio import RatioRule, layer_trust_ratio

# Odd sizes: a vector tail, several of the trust ratio's 32,768-element chunks, many threads.
SHAPES = [(7,), (301, 1001)]


def op_types(function, *args) -> set[str]:
    graph = tf.function(function).get_concrete_function(*args).graph
    return {op.type for op in graph.get_operations()}


def test_the_set_up_built_the_library_and_the_optimizers_use_it():
    assert kernels.fused_ops() is not None, f"{kernels.FUSED_LIBRARY} missing: run scripts/setup.sh"
    variables = [keras.Variable(np.ones((4, 3), "float32")), keras.Variable(np.ones(3, "float32"))]
    grads = [keras.ops.ones((4, 3)), keras.ops.ones(3)]
    uses = {
        "CoupledKerasMomentum": optimizers.LARS(0.1, weight_decay=1e-4),
        "CoupledMomentum": optimizers.SGD(0.1, momentum=0.9, weight_decay=1e-4),
    }
    for kernel, optimizer in uses.items():
        optimizer.build(variables)
        types = op_types(lambda opt=optimizer: opt.apply(grads, variables))
        assert kernel in types and "ResourceApplyKerasMomentum" not in types, types
    lbsgd = optimizers.LBSGD(0.1, momentum=0.9, warmup_strategy="lars")
    lbsgd.build(variables)
    types = op_types(lambda: lbsgd.apply(grads, variables))
    assert {"TrustRatio", "CoupledKerasMomentum"} <= types and "L2Loss" not in types, types


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("weight_decay", [0.0, 5e-4])
@pytest.mark.parametrize(
    "fused, unfused",
    [
        (kernels.heavy_ball, tf.raw_ops.ResourceApplyKerasMomentum),
        (kernels.buffered_momentum, tf.raw_ops.ResourceApplyMomentum),
    ],
)
def test_momentum_kernels_equal_tensorflows_unfused_ops_bit_for_bit(
    fused, unfused, weight_decay, nesterov, dtype, shape
):
    rng = np.random.default_rng(0)
    start = [rng.standard_normal(shape).astype(dtype) for _ in range(2)]
    ours = [tf.Variable(x) for x in start]
    theirs = [tf.Variable(x) for x in start]
    for step in range(3):
        lr, momentum = tf.constant(0.1 / (step + 1), dtype), tf.constant(0.9 - 0.1 * step, dtype)
        g = tf.constant(rng.standard_normal(shape).astype(dtype))
        fused(*ours, lr, g, momentum, nesterov, tf.constant(weight_decay, dtype))
        unfused(
            var=theirs[0].handle,
            accum=theirs[1].handle,
            lr=lr,
            grad=g + tf.constant(weight_decay, dtype) * theirs[0],
            momentum=momentum,
            use_nesterov=nesterov,
        )
        for a, b in zip(ours, theirs, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())


def numpy_trust_ratio(w, g, wd, *, power, eps, coefficient, unit_at_zero, bounds):
    """LARS's (power 1) and MXNet LBSGD's (power 2) ratio, in float64."""
    w_norm = np.linalg.norm(w.astype(np.float64))
    g_norm = np.linalg.norm(g.astype(np.float64))
    if power == 1:
        ratio = w_norm / (g_norm + wd * w_norm + eps)
    else:
        ratio = w_norm / np.sqrt(g_norm**2 + wd * w_norm**2 + eps)
    ratio *= coefficient
    if unit_at_zero and not (w_norm > 0 and g_norm > 0):
        ratio = 1.0
    return float(np.clip(ratio, *bounds))


RATIO_CASES = {
    "lars": dict(power=1, eps=0.0, coefficient=0.001, unit_at_zero=True, bounds=(-np.inf, np.inf)),
    "lars eps": dict(
        power=1, eps=1e-3, coefficient=0.02, unit_at_zero=True, bounds=(-np.inf, np.inf)
    ),
    "lbsgd": dict(power=2, eps=1e-18, coefficient=1.0, unit_at_zero=False, bounds=(0.01, 100.0)),
}


@pytest.mark.parametrize("case", RATIO_CASES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("zero", [None, "w", "g"])
def test_trust_ratio_matches_its_formula(case, shape, zero):
    rng = np.random.default_rng(1)
    options = RATIO_CASES[case]
    for scale in (1e-4, 1.0, 1e3):  # ratios below, inside and above LBSGD's clip bounds
        w = rng.standard_normal(shape).astype("float32")
        g = (scale * rng.standard_normal(shape)).astype("float32")
        if zero:
            (w if zero == "w" else g)[...] = 0
        expected = numpy_trust_ratio(w, g, 5e-4, **options)
        variable = keras.Variable(w)
        rule = RatioRule(
            power=options["power"],
            epsilon=options["eps"],
            coefficient=options["coefficient"],
            unit_at_zero=options["unit_at_zero"],
            bounds=options["bounds"],
        )
        got = layer_trust_ratio(variable, tf.constant(g), tf.constant(5e-4), rule)
        np.testing.assert_allclose(float(got), expected, rtol=1e-6)


def test_trust_ratio_does_not_depend_on_the_number_of_threads():
    script = (
        "import tensorflow as tf, numpy as np, keras\n"
        "tf.config.threading.set_intra_op_parallelism_threads({threads})\n"
        "from toolkit.optimizers.trust_ratio import RatioRule, layer_trust_ratio\n"
        "rng = np.random.default_rng(2)\n"
        "w, g = (rng.standard_normal(1_000_003).astype('float32') for _ in range(2))\n"
        "print(float(layer_trust_ratio(keras.Variable(w), tf.constant(g), 1e-4,"
        " RatioRule(power=2)).numpy().view('uint32')))\n"
    )
    bits = {
        subprocess.run(
            [sys.executable, "-c", script.format(threads=threads)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for threads in (1, 2, 5)
    }
    assert len(bits) == 1, bits


@pytest.mark.parametrize(
    "name, params",
    [
        ("lars", dict(learning_rate=0.1, weight_decay=1e-3, trust_coefficient=0.02, clip=True)),
        (
            "lbsgd",
            dict(learning_rate=0.05, momentum=0.9, weight_decay=1e-4, warmup_strategy="lars"),
        ),
        ("sgd", dict(learning_rate=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    ],
)
def test_fused_and_unfused_paths_train_alike(name, params, monkeypatch):
    """The unfused path is what a GPU variable, or a machine without the library, runs."""

    def train():
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
        model.compile(optimizers.get(name, **params), "mse", jit_compile=False)
        rng = np.random.default_rng(3)
        x, y = rng.standard_normal((64, 8)), rng.standard_normal((64, 1))
        model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
        return model.get_weights()

    fused = train()
    monkeypatch.setattr(kernels, "fused_ops", lambda: None)
    unfused = train()
    for a, b in zip(fused, unfused, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_float16_variables_take_tensorflows_own_kernels():
    variable = tf.Variable(np.ones(5, "float16"))
    velocity = tf.Variable(np.zeros(5, "float16"))
    kernels.heavy_ball(variable, velocity, 0.5, tf.ones(5, "float16"), 0.9, False, 0.5)
    np.testing.assert_array_equal(variable.numpy(), np.full(5, 0.25, "float16"))  # 1 - .5 * 1.5


def test_a_library_that_does_not_load_warns_and_falls_back(tmp_path, monkeypatch):
    broken = tmp_path / "fused_kernels.so"
    broken.write_bytes(b"not a shared object")
    monkeypatch.setattr(kernels, "FUSED_LIBRARY", broken)
    kernels.fused_ops.cache_clear()
    try:
        with pytest.warns(UserWarning, match="Rebuild it with scripts/setup.sh"):
            assert kernels.fused_ops() is None
    finally:
        kernels.fused_ops.cache_clear()
