"""LARS against You, Gitman and Ginsburg's update written out independently in numpy."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from conftest import as_in_training

from toolkit.optimizers import LARS

STEPS = 30


def lars_reference(w, grads, lr, *, momentum, weight_decay, eta, eps, adapted, clip, nesterov):
    """One variable's trajectory under LARS (paper's Algorithm 1, plus LARC and Nesterov)."""
    w = w.astype(np.float64)
    v = np.zeros_like(w)
    for t, g in enumerate(grads):
        g = g.astype(np.float64)
        wd = weight_decay if adapted else 0.0
        local = 1.0
        w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
        if adapted and w_norm > 0 and g_norm > 0:
            local = eta * w_norm / (g_norm + weight_decay * w_norm + eps)
        rate = lr(t) * local
        if clip and adapted:
            rate = min(rate, lr(t))
        update = rate * (g + wd * w)
        v = momentum * v + update
        w = w - (momentum * v + update if nesterov else v)
    return w


def lr(t):
    return 0.5 / (1 + 0.05 * t)


class StepSchedule(keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
        return 0.5 / (1 + 0.05 * keras.ops.cast(step, "float32"))


def make_variables(rng):
    """A 2-D kernel, a 1-D bias, a 4-D conv kernel and an all-zero kernel (norm 0)."""
    return [
        keras.Variable(rng.standard_normal((6, 4)).astype("float32"), name="dense_kernel"),
        keras.Variable(rng.standard_normal((4,)).astype("float32"), name="dense_bias"),
        keras.Variable(rng.standard_normal((3, 3, 2, 4)).astype("float32"), name="conv_kernel"),
        keras.Variable(np.zeros((5, 2), "float32"), name="zero_kernel"),
    ]


@pytest.mark.parametrize(
    "options",
    [
        dict(momentum=0.9, weight_decay=5e-4, trust_coefficient=0.001, epsilon=0.0),
        dict(
            momentum=0.9,
            weight_decay=5e-4,
            trust_coefficient=0.02,
            epsilon=1e-3,
            clip=True,
        ),
        dict(momentum=0.8, weight_decay=1e-2, trust_coefficient=0.01, nesterov=True),
        dict(momentum=0.0, weight_decay=0.0, trust_coefficient=0.005),
        dict(
            momentum=0.9,
            weight_decay=1e-3,
            exclude_from_layer_adaptation=["conv", "bias"],
        ),
    ],
)
def test_matches_published_rule(options):
    rng = np.random.default_rng(0)
    variables = make_variables(rng)
    initial = [keras.ops.convert_to_numpy(v) for v in variables]
    grads = [
        [rng.standard_normal(v.shape).astype("float32") for v in variables] for _ in range(STEPS)
    ]
    opt = LARS(learning_rate=StepSchedule(), **options)
    for step_grads in grads:
        opt.apply(step_grads, variables)

    patterns = options.get("exclude_from_layer_adaptation")
    for i, v in enumerate(variables):
        adapted = v.ndim > 1 if patterns is None else not any(p in v.path for p in patterns)
        expected = lars_reference(
            initial[i],
            [g[i] for g in grads],
            lr,
            momentum=options["momentum"],
            weight_decay=options["weight_decay"],
            eta=options.get("trust_coefficient", 0.001),
            eps=options.get("epsilon", 0.0),
            adapted=adapted,
            clip=options.get("clip", False),
            nesterov=options.get("nesterov", False),
        )
        np.testing.assert_allclose(keras.ops.convert_to_numpy(v), expected, rtol=1e-5, atol=1e-6)


def test_the_velocity_slot_holds_minus_v_as_documented():
    """The docstrings' ``v`` (MXNet's, positive) is stored negated, as Keras's SGD stores it:
    what ``velocities`` and a checkpoint hold."""
    rng = np.random.default_rng(3)
    w = keras.Variable(rng.standard_normal((6, 4)).astype("float32"))
    opt = LARS(learning_rate=0.1, momentum=0.9, trust_coefficient=0.01)
    v = np.zeros((6, 4))
    for _ in range(3):
        g = rng.standard_normal((6, 4)).astype("float32")
        before = keras.ops.convert_to_numpy(w).astype(np.float64)
        v = 0.9 * v + 0.1 * 0.01 * np.linalg.norm(before) / np.linalg.norm(g) * g
        opt.apply([g], [w])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(opt.velocities[0]), -v, rtol=1e-5)


def test_default_exclusions_are_one_dimensional_variables():
    layer = keras.layers.Dense(3)
    layer.build((None, 4))
    norm = keras.layers.BatchNormalization()
    norm.build((None, 3))
    opt = LARS()
    assert opt.is_adapted(layer.kernel)
    assert not opt.is_adapted(layer.bias)
    assert not any(opt.is_adapted(v) for v in norm.trainable_variables)


def test_clip_caps_the_rate_at_the_global_rate():
    """With a huge trust coefficient LARC makes LARS plain momentum SGD with L2 decay."""
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal((8, 8)).astype("float32")
    grads = [rng.standard_normal((8, 8)).astype("float32") for _ in range(5)]
    variable = keras.Variable(w0)
    opt = LARS(
        learning_rate=0.1,
        momentum=0.9,
        weight_decay=1e-3,
        trust_coefficient=1e3,
        clip=True,
    )
    for g in grads:
        opt.apply([g], [variable])
    w, v = w0.astype(np.float64), 0.0
    for g in grads:
        v = 0.9 * v + 0.1 * (g + 1e-3 * w)
        w = w - v
    np.testing.assert_allclose(keras.ops.convert_to_numpy(variable), w, rtol=1e-5, atol=1e-6)


def test_trust_ratios_report_the_trust_ratio():
    rng = np.random.default_rng(4)
    kernel = keras.Variable(rng.standard_normal((4, 4)).astype("float32"), name="k")
    grad = rng.standard_normal((4, 4)).astype("float32")
    wn, gn = np.linalg.norm(kernel.numpy()), np.linalg.norm(grad)
    expected = {"k": pytest.approx(0.01 * wn / (gn + 0.1 * wn), rel=1e-5)}
    opt = LARS(trust_coefficient=0.01, weight_decay=0.1)
    assert opt.trust_ratios([grad], [kernel]) == expected  # before it is built, too
    opt.build([kernel])
    assert opt.trust_ratios([grad], [kernel]) == expected


def test_the_ratios_of_the_latest_update_are_kept_outside_the_optimizer_state():
    """Outside it on TensorFlow and PyTorch; on JAX, whose compiled step is stateless and gives
    back only the optimizer's variables, they are one of them (a vector of one ratio here)."""
    rng = np.random.default_rng(5)
    kernel = keras.Variable(rng.standard_normal((4, 3)).astype("float32"), name="k")
    bias = keras.Variable(rng.standard_normal(3).astype("float32"), name="b")
    opt = LARS(trust_coefficient=0.01, weight_decay=0.1)
    opt.build([kernel, bias])
    assert np.isnan(opt.applied_trust_ratios()["k"])  # nothing applied yet
    for _ in range(2):
        grads = [rng.standard_normal(v.shape).astype("float32") for v in (kernel, bias)]
        expected = opt.trust_ratios(grads, [kernel, bias])  # before the update moves w
        opt.apply(grads, [kernel, bias])
        assert opt.applied_trust_ratios() == expected == {"k": expected["k"]}
    ratios = [(1,)] if keras.backend.backend() == "jax" else []
    assert sorted(tuple(v.shape) for v in opt.variables) == sorted([(), (), (3,), (4, 3), *ratios])


def test_a_layer_without_a_gradient_keeps_the_ratio_of_its_last_update():
    rng = np.random.default_rng(7)
    first, second = (
        keras.Variable(rng.standard_normal((3, 3)).astype("float32"), name=name)
        for name in ("first", "second")
    )
    opt = LARS(trust_coefficient=0.01, weight_decay=0.1)
    opt.build([first, second])
    step = as_in_training(lambda grads: opt.apply(grads, [first, second]))
    grads = [rng.standard_normal((3, 3)).astype("float32") for _ in range(2)]
    both = opt.trust_ratios(grads, [first, second])
    step(grads)
    only_first = opt.trust_ratios(grads[:1], [first])
    with pytest.warns(UserWarning, match="Gradients do not exist for variables \\['second'\\]"):
        opt.apply([grads[0], None], [first, second])
    assert opt.applied_trust_ratios() == {"first": only_first["first"], "second": both["second"]}
    assert only_first["first"] != both["first"]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(momentum=-0.5), "momentum"),
        (dict(weight_decay=-1.0), "weight_decay"),
        (dict(trust_coefficient=0.0), "trust_coefficient"),
        (dict(epsilon=-1e-9), "epsilon"),
    ],
)
def test_validation_names_the_argument(kwargs, field):
    with pytest.raises(ValueError, match=field):
        LARS(**kwargs)
