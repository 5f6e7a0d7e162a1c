"""The gradient noise scale estimator against an analytic oracle: linear least squares with
Gaussian inputs and label noise, where ``|G|²`` and ``tr Σ`` at fixed weights are computed
exactly in numpy from the per-example gradients over the whole dataset."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import dashboard

from toolkit.scaling import noise_scale
from toolkit.scaling.noise_scale import Smoother, estimate


def test_estimate_inverts_the_expected_norms_exactly():
    grad_sq, trace = 3.0, 480.0
    for b_small, b_big in ((32, 64), (16, 256), (1, 2)):
        small, big = grad_sq + trace / b_small, grad_sq + trace / b_big
        assert estimate(small, big, b_small, b_big) == pytest.approx((grad_sq, trace))


@pytest.mark.parametrize("b_small, b_big", [(0, 4), (8, 8), (16, 8)])
def test_estimate_needs_two_different_positive_batches(b_small, b_big):
    with pytest.raises(ValueError, match="b_small < b_big"):
        estimate(1.0, 0.5, b_small, b_big)


def least_squares(n=200_000, dim=20, noise=2.0, seed=0):
    """Per-example gradients ``x_i (x_i·w − y_i)`` of ``½(x·w − y)²`` at weights ``w`` off the
    optimum, and the exact ``B_simple`` of the whole dataset."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim))
    w_true = rng.normal(size=dim)
    y = x @ w_true + noise * rng.normal(size=n)
    w = w_true + 0.3 * rng.normal(size=dim)
    per_example = x * (x @ w - y)[:, None]
    true_gradient = per_example.mean(axis=0)
    trace_sigma = per_example.var(axis=0).sum()  # tr of the population covariance
    return per_example, trace_sigma / (true_gradient @ true_gradient)


def test_sampled_batches_converge_to_the_exact_noise_scale():
    per_example, exact = least_squares()
    rng = np.random.default_rng(1)
    workers, b_small = 8, 32  # data parallel: 8 small batches, their mean is the big one
    smoother = Smoother(decay=0.999)
    for _ in range(3000):
        batches = per_example[rng.integers(0, len(per_example), size=(workers, b_small))]
        local = batches.mean(axis=1)
        small_sq = (local**2).sum(axis=1).mean()
        big_sq = (local.mean(axis=0) ** 2).sum()
        smoother.update(*estimate(small_sq, big_sq, b_small, workers * b_small))
    assert 20 < exact < 2000  # a regime where the batch size matters
    assert smoother.b_simple == pytest.approx(exact, rel=0.10)


def test_the_smoother_is_bias_corrected_and_averages_each_quantity_not_the_ratio():
    smoother = Smoother(decay=0.9)
    smoother.update(2.0, 100.0)
    assert (smoother.grad_sq, smoother.trace_sigma) == pytest.approx((2.0, 100.0))
    smoother.update(0.5, 10.0)
    weights = np.array([0.9 * 0.1, 0.1]) / (1 - 0.9**2)
    grad_sq, trace = weights @ [2.0, 0.5], weights @ [100.0, 10.0]
    assert smoother.b_simple == pytest.approx(trace / grad_sq)
    assert smoother.b_simple != pytest.approx(weights @ [100.0 / 2.0, 10.0 / 0.5])


def test_no_noise_scale_while_the_averaged_gradient_is_not_positive():
    smoother = Smoother(decay=0.5)
    assert smoother.b_simple is None  # nothing measured yet
    smoother.update(-1.0, 50.0)  # one step's |G|² may be negative: legitimate noise
    assert smoother.b_simple is None
    smoother.update(5.0, 50.0)
    assert smoother.b_simple > 0
    assert smoother.b_simple == pytest.approx(smoother.trace_sigma / smoother.grad_sq)
    smoother.update(float("nan"), 1.0)  # skipped
    assert smoother.count == 2
    negative_trace = Smoother(decay=0.5)
    negative_trace.update(1.0, -5.0)
    assert negative_trace.b_simple is None


def test_the_decay_must_be_in_zero_one():
    for decay in (-0.1, 1.0, 2.0):
        with pytest.raises(ValueError, match="decay"):
            Smoother(decay=decay)


# --- In training runs -------------------------------------------------------------------------

NOISY = {  # the quickstart's model and data; a fixed global batch, accumulated over 2 steps
    "name": "noisy",
    "dataset": {"name": "mnist1d"},
    "model": {"name": "cnn1d"},
    "optimizer": {"name": "sgd", "learning_rate": 0.05, "params": {"momentum": 0.9}},
    "batch": {"global_size": 128, "accumulation": 2},
    "epochs": 2,
    "logging": {"every_steps": 10, "noise_scale_every_steps": 1, "noise_scale_smoothing": 0.9},
}


@pytest.fixture(scope="module")
def two_worker_gns(tmp_path_factory, subprocess_env):
    """The ``gns`` events of one 2-worker run of :data:`NOISY`."""
    import os

    from test_train import wait

    from toolkit.config import from_mapping
    from toolkit.launching import launch as launcher
    from toolkit.runs.events import read_events

    os.environ["PATH"] = subprocess_env["PATH"]
    root = tmp_path_factory.mktemp("runs")
    run = launcher.launch(from_mapping({**NOISY, "workers": 2}), runs_root_dir=root)
    assert wait(run)["state"] == "completed", run.stdout_path.read_text()[-3000:]
    events = read_events(run.events_path)
    return events[events.phase == "gns"].reset_index(drop=True)


@pytest.fixture(scope="module")
def one_worker_gns(tmp_path_factory):
    from toolkit.config import from_mapping
    from toolkit.runs.events import read_events
    from toolkit.train import train

    run = train(from_mapping(NOISY), tmp_path_factory.mktemp("runs") / "one", verbose=0)
    events = read_events(run.events_path)
    return events[events.phase == "gns"].reset_index(drop=True)


def test_two_workers_log_every_measurement_at_its_step_however_steps_are_grouped(
    tmp_path, subprocess_env
):
    """With several workers the noise scale is measured inside the compiled step, so its
    interval (3 updates) need not divide Keras's steps per execution: events every 10 steps
    and epochs of 40 allow 2. Every measurement is logged at its own step, with the values of
    the same run at one step per execution (events every step)."""
    import os

    from test_train import wait

    from toolkit.config import from_mapping
    from toolkit.launching import launch as launcher
    from toolkit.runs.events import read_events

    os.environ["PATH"] = subprocess_env["PATH"]
    gns = {}
    for every_steps in (10, 1):
        config = {
            **NOISY,
            "workers": 2,
            "batch": {"per_worker": 50},
            "logging": {"every_steps": every_steps, "noise_scale_every_steps": 3},
        }
        run = launcher.launch(from_mapping(config), runs_root_dir=tmp_path)
        assert wait(run)["state"] == "completed", run.stdout_path.read_text()[-3000:]
        assert run.meta()["steps_per_execution"] == (2 if every_steps == 10 else 1)
        events = read_events(run.events_path)
        gns[every_steps] = events[events.phase == "gns"].set_index("step")
    assert gns[10].index.tolist() == list(range(3, 2 * 40 + 1, 3))
    columns = ["small_sq", "big_sq", "b_simple", "grad_sq", "trace_sigma"]
    pd.testing.assert_frame_equal(gns[10][columns], gns[1][columns], check_exact=True)


def test_two_workers_measure_per_worker_and_global_batches(two_worker_gns):
    gns = two_worker_gns
    updates = 2 * (4000 // 128)  # 2 epochs of the 4000 training examples
    assert len(gns) == updates and (gns.step % 2 == 0).all()  # one per update of 2 steps
    assert (gns.b_small == 64).all() and (gns.b_big == 128).all()  # 32 x 2 steps; 2 workers


def test_logged_estimates_follow_the_published_formulas(two_worker_gns):
    gns, decay = two_worker_gns, NOISY["logging"]["noise_scale_smoothing"]
    b_small, b_big = 64, 128
    grad_sq = (b_big * gns.big_sq - b_small * gns.small_sq) / (b_big - b_small)
    trace = (gns.small_sq - gns.big_sq) / (1 / b_small - 1 / b_big)
    np.testing.assert_allclose(gns.grad_sq_step, grad_sq, rtol=1e-9)
    np.testing.assert_allclose(gns.trace_sigma_step, trace, rtol=1e-9)
    np.testing.assert_allclose(gns.grad_sq, debiased_ema(grad_sq, decay), rtol=1e-9)
    np.testing.assert_allclose(gns.trace_sigma, debiased_ema(trace, decay), rtol=1e-9)
    positive = gns.grad_sq > 0
    np.testing.assert_allclose(
        gns.b_simple[positive], (gns.trace_sigma / gns.grad_sq)[positive], rtol=1e-9
    )
    assert gns.b_simple[~positive].isna().all()


def debiased_ema(values, decay) -> np.ndarray:
    """Adam-style bias-corrected exponential average, written out."""
    out, acc = [], 0.0
    for n, value in enumerate(values, start=1):
        acc = decay * acc + (1 - decay) * value
        out.append(acc / (1 - decay**n))
    return np.array(out)


def block_estimates(gns, blocks=5) -> np.ndarray:
    """``B_simple`` of each of ``blocks`` consecutive stretches of a run (ratio of the means)."""
    parts = np.array_split(np.arange(len(gns)), blocks)
    return np.array([gns.trace_sigma_step[p].mean() / gns.grad_sq_step[p].mean() for p in parts])


def test_one_worker_halves_agree_with_two_workers_within_their_spread(
    two_worker_gns, one_worker_gns
):
    one, two = one_worker_gns, two_worker_gns
    assert (one.b_small == 32).all() and (one.b_big == 64).all()  # halves of 64 per step
    b_one = one.trace_sigma_step.mean() / one.grad_sq_step.mean()
    b_two = two.trace_sigma_step.mean() / two.grad_sq_step.mean()
    spread = block_estimates(one).std() + block_estimates(two).std()
    print(f"B_simple: 1 worker {b_one:.0f}, 2 workers {b_two:.0f}, spread {spread:.0f}")
    assert abs(b_one - b_two) <= 2 * spread


# --- Config and dashboard ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, message",
    [
        ("logging.noise_scale_every_steps=-1", "logging.noise_scale_every_steps: Input should be"),
        ("logging.noise_scale_every_steps=2.5", "logging.noise_scale_every_steps: Input should"),
        ("logging.noise_scale_smoothing=1", "logging.noise_scale_smoothing: Input should be less"),
        ("logging.noise_scale_smoothing=-0.1", "logging.noise_scale_smoothing: Input should be"),
        ("logging.noise_scale_batch=1", "logging.noise_scale_batch: Input should be greater"),
    ],
)
def test_bad_noise_scale_settings_are_config_errors_naming_the_field(override, message):
    from toolkit.config import ConfigError, from_mapping

    with pytest.raises(ConfigError, match=message):
        from_mapping({}, [override])


@pytest.mark.parametrize("with_gns", [True, False])
def test_run_detail_shows_the_noise_scale_against_the_batch(with_gns, tmp_path, monkeypatch):
    from fabricate import fake_run

    from app.data import md_escape

    monkeypatch.setenv("LBL_RUNS", str(tmp_path))
    fake_run(tmp_path, "gns", events=400, gns_every=20 if with_gns else None)
    at = dashboard().run()
    at.switch_page("views/detail.py").run()
    assert not at.exception, at.exception
    texts = " ".join(t.value for t in [*at.text, *at.caption])
    titles = [c.proto.spec for c in at.get("plotly_chart")]
    if with_gns:
        assert md_escape("B_simple ≈") in texts and "× below it" in texts
        chart = next(spec for spec in titles if "B_simple against" in spec)
        assert '"type":"log"' in chart and '"name":"global batch 64"' in chart
        assert '"shapes"' not in chart  # a shape on a log axis would be drawn at 10^64
    else:
        assert "B_simple: this run logged no estimate" in texts  # it has ended
        assert not any("B_simple against" in spec for spec in titles)
    at.switch_page("views/compare.py").run()
    assert not at.exception, at.exception
    metrics = at.multiselect[1].options
    assert ("gns/b_simple" in metrics) == with_gns


# --- The probe ----------------------------------------------------------------------------------


def test_a_band_with_unbounded_resamples_is_unbounded_without_a_warning():
    import warnings

    from toolkit.config import from_mapping
    from toolkit.launching.probe import summarize

    n = 40  # |G|² measured as 2 and -1.8 in turn: a mean of 0.1, but many resamples' <= 0
    gns = pd.DataFrame({"grad_sq_step": np.resize([2.0, -1.8], n), "trace_sigma_step": 1.0})
    config = from_mapping({"batch": {"per_worker": 32}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "invalid value encountered in subtract"
        result = summarize(gns, "probe-x", config, world_size=1)
    assert result.b_simple == pytest.approx(10.0)
    low, high = result.band
    assert 0 < low < 10 and high == np.inf


def test_summarize_reads_the_late_measurements_and_suggests_a_batch():
    from toolkit.config import from_mapping
    from toolkit.launching.probe import CALIBRATION, summarize

    rng = np.random.default_rng(0)
    n = 400
    gns = pd.DataFrame(  # early: B = 10; late: |G|² = 0.01, tr Σ = 5 with noise, so B = 500
        {
            "grad_sq_step": np.r_[np.full(n // 2, 1.0), 0.01 + 0.05 * rng.normal(size=n // 2)],
            "trace_sigma_step": np.r_[np.full(n // 2, 10.0), 5 + rng.normal(size=n // 2)],
        }
    )
    config = from_mapping({"batch": {"per_worker": 32}, "lr_scaling": {"rule": "sqrt"}})
    result = summarize(gns, "probe-x", config, world_size=2)
    late = gns.iloc[n // 2 :]
    assert result.b_simple == pytest.approx(late.trace_sigma_step.mean() / late.grad_sq_step.mean())
    low, high = result.band
    assert low < result.b_simple < high and 200 < result.b_simple < 2000
    assert result.global_batch == 64 and result.suggested_batch == 2 ** round(
        np.log2(result.b_simple)
    )
    assert result.suggested_learning_rate == pytest.approx(
        0.1 * np.sqrt(result.suggested_batch / 256)
    )
    text = result.reading()
    assert text.startswith(f"B_simple ≈ {result.b_simple:,.0f} at the start of training")
    assert noise_scale.GROWS in text  # which B_simple it is, and why the others differ
    assert text.splitlines()[-1].startswith(  # defect 6: a batch to use, and why
        f"Batch to use: {result.suggested_batch:,}, the power of two nearest this B_simple"
    )
    assert (
        f"Steps to a given loss, taking B_noise as B_simple ({result.b_simple:,.0f}), a floor: "
        f"your global batch 64 is {result.b_simple / 64:.1f}× below it"
    ) in text
    factors = pd.read_csv("experiments/probe_protocol/factors.csv").factor  # the raw table
    measured = (factors.median(), factors.min(), factors.max())
    assert CALIBRATION == pytest.approx(measured, abs=0.005)
    calibrated = [f"{factor * result.b_simple:,.0f}" for factor in measured]
    assert "B_crit ≈ {} ({}–{}): B_simple × {:g}".format(*calibrated, measured[0]) in text
    assert "python -m toolkit calibrate CONFIG` measures it on yours" in text
    assert (
        f"lr_scaling (sqrt) gives a learning rate of {result.suggested_learning_rate:.4g}" in text
    )
    with pytest.raises(ValueError, match="a probe needs"):
        summarize(gns.iloc[:6], "probe-x", config, world_size=2)


def test_the_probe_cli_on_the_quickstart(tmp_path, subprocess_env):
    """The probe follows its stated path whatever the config's schedule: the quickstart's
    warmup (1 epoch, 125 batches) cut to the probe's first half, then its peak rate (0.5 at
    batch 64, linear: 0.25 at 32) held, where cosine would decay it."""
    from conftest import run_cli

    from toolkit.runs.events import read_events
    from toolkit.runs.rundir import list_runs
    from toolkit.terminal import runs_table

    args = ["probe", "experiments/quickstart.yaml", "--steps", "80"]
    result = run_cli(args, tmp_path, subprocess_env)
    assert result.returncode == 0, result.stderr[-3000:]
    said = result.stdout
    assert "B_simple ≈" in said and "taking B_noise as B_simple (" in said
    assert "your global batch 32 is" in said
    (run,) = list_runs(tmp_path)
    assert run.meta()["probe"] is True and run.run_id in result.stdout
    assert run.status()["state"] == "completed"
    events = read_events(run.events_path)
    rates = events[events.phase == "train"].set_index("step").lr
    assert rates.index.max() == 80
    np.testing.assert_allclose(rates[rates.index > 40], 0.25, rtol=1e-6)
    warmup = rates[rates.index <= 40]
    assert (np.diff(warmup) > 0).all() and warmup.iloc[0] < 0.25 / 4
    assert run.run_id not in runs_table(tmp_path)  # hidden, as on the Runs page,
    assert run.run_id in runs_table(tmp_path, probes=True)  # unless asked for (runs --all)


@pytest.mark.parametrize("per_execution, every", [(1, 4), (2, 3)])
def test_a_model_trained_by_hand_gets_the_noise_scale_from_a_keras_callback(per_execution, every):
    """At Keras's steps_per_execution ``k`` the callback measures at the end of the execution
    that reaches each multiple of ``every`` (k=2 and every=3: steps 4, 6, 10, 12, ...)."""
    import keras

    from toolkit.scaling.noise_scale import Smoother
    from toolkit.training.callbacks import noise_scale_callback

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2048, 8)).astype("float32")
    y = (x @ rng.normal(size=8) > 0).astype("int32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    model.compile(
        "sgd",
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=per_execution,
    )
    gns = noise_scale_callback(x, y, batch_size=64, every_steps=every, smoothing=0.8)
    model.fit(x, y, batch_size=64, epochs=2, verbose=0, callbacks=[gns])
    ends = range(per_execution, 65, per_execution)  # 32 batches an epoch
    expected = sorted({min(e for e in ends if e >= m) for m in range(every, 65, every)})
    assert [r["step"] for r in gns.records] == expected
    assert all(r["b_small"] == 32 and r["b_big"] == 64 for r in gns.records)
    replay = Smoother(decay=0.8)
    for r in gns.records:
        replay.update(r["grad_sq_step"], r["trace_sigma_step"])
    assert gns.smoother.b_simple == pytest.approx(replay.b_simple) and replay.b_simple > 0


def test_the_probes_gradient_graph_is_traced_once_and_matches_an_eager_tape():
    import keras
    import tensorflow as tf

    from toolkit import backends
    from toolkit.backends import base
    from toolkit.training import data, models

    dataset = data.load("mnist1d")
    model = models.build("cnn1d", input_shape=dataset.input_shape, num_classes=10, seed=0)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = dataset.x_train, dataset.y_train
    for size in (32, 16, 5):  # the probe batch, a noise-scale half, anything else
        fast = backends.current().loss_gradients(model, x[:size], y[:size])
        with tf.GradientTape() as tape:  # the oracle: an eager tape, written out
            logits = model(x[:size], training=False)
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y[:size], logits)
        for got, want in zip(fast, tape.gradient(loss, model.trainable_variables)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert base._GRADIENTS[model].experimental_get_tracing_count() == 1
