"""AdaScale (Johnson et al. 2020) in training: the numpy model of Algorithm 1 (the noise meter's
estimates, bias-corrected averages, the gain clipped to ``[1, S]``, the clock ``τ`` and the
base schedule read at it; test_adascale_gain.py holds it and the gain's formula, checked on
every backend) must reproduce, update by update, the rates, gains and clocks a real run
logged, on one worker and on two under horovodrun. At ``S = 1`` it must train exactly like the
base optimizer, and a run resumed from a checkpoint exactly like an uninterrupted one."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import backends_running
from test_adascale_gain import numpy_adascale

from toolkit import backends, sections
from toolkit.config import ConfigError, from_mapping
from toolkit.plan import Scale
from toolkit.runs.events import read_events


def cosine_with_warmup(lr, total, warmup):
    """Keras's ``CosineDecay`` to 0 over ``total`` behind a linear warmup from 0."""

    def rate(tau):
        decayed = 0.5 * (1 + math.cos(math.pi * min(tau, total) / total))
        return lr * decayed * min(tau / warmup, 1.0)

    return rate


ADASCALE = {  # the quickstart's data and model; 8x the base batch
    "name": "adascale",
    "dataset": {"name": "mnist1d"},
    "model": {"name": "cnn1d"},
    "optimizer": {"name": "sgd", "learning_rate": 0.05, "params": {"momentum": 0.9}},
    "schedule": {"name": "cosine", "warmup": {"epochs": 0.5}},
    "batch": {"global_size": 256},
    "lr_scaling": {"rule": "adascale", "base_batch": 32},
    "epochs": 2,
    "logging": {"every_steps": 1, "noise_scale_every_steps": 1, "noise_scale_smoothing": 0.9},
}
NUM_TRAIN = 4000  # MNIST-1D's training set


def state_rtol(backend: str | None) -> float:
    """How far AdaScale's logged state may be from the numpy model's, on ``backend`` (default:
    this process's): float64's rounding, or float32's on JAX without ``jax_enable_x64``
    (8.5e-8 to 1.5e-7 apart measured over 49 to 160 updates)."""
    state = (backends.of(backend) if backend else backends.current()).state_dtype()
    return 1e-9 if state == "float64" else 1e-5


def check_against_the_model(events, *, b_small, b_big, backend: str | None = None):
    """Every update's logged gain, rate and clock are the numpy model's, from the logged
    norms, to the rounding of the state's dtype on ``backend`` (:func:`state_rtol`); the run
    ends at the update whose clock reaches the base run's updates."""
    config = from_mapping(ADASCALE)
    base_updates = NUM_TRAIN // 32
    total = config.epochs * base_updates
    train, gns = events[events.phase == "train"], events[events.phase == "gns"]
    assert train.step.tolist() == gns.step.tolist() == list(range(1, len(train) + 1))
    gains, rates, taus = numpy_adascale(
        gns.small_sq.to_numpy(),
        gns.big_sq.to_numpy(),
        b_small=b_small,
        b_big=b_big,
        base_batch=32,
        batch=256,
        decay=0.9,
        base_rate=cosine_with_warmup(0.05, total, round(0.5 * base_updates)),
    )
    rtol = state_rtol(backend)
    np.testing.assert_allclose(train.gain, gains, rtol=rtol)
    np.testing.assert_allclose(train.tau, taus, rtol=rtol)
    np.testing.assert_allclose(train.lr, rates, rtol=1e-5, atol=1e-6 * rates.max())  # float32
    assert taus[-1] >= total > taus[-2]  # ends on AdaScale's clock, not on epochs
    assert 1 < gains.mean() < 8 and gains.max() > 1.5  # the gain did something
    return taus


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory):
    from toolkit.train import train

    run = train(from_mapping(ADASCALE), tmp_path_factory.mktemp("runs") / "one", verbose=0)
    return run, read_events(run.events_path)


def test_one_worker_logs_what_the_numpy_model_of_adascale_computes(one_worker):
    run, events = one_worker
    check_against_the_model(events, b_small=128, b_big=256)  # two halves of its batch
    assert run.status()["state"] == "completed"
    assert run.meta()["total_steps"] == 2 * NUM_TRAIN // 32  # progress counts τ


def test_one_worker_measures_the_noise_on_the_extra_batch_it_is_given(tmp_path):
    """``logging.noise_scale_batch=64``: halves of 32 of a fresh batch of 64, not of the
    step's 256, in the events and in the gain the numpy model recomputes from them."""
    from toolkit.plan import RunPlan
    from toolkit.train import train

    config = from_mapping(ADASCALE, ["logging.noise_scale_batch=64"])
    run = train(config, tmp_path, verbose=0)
    events = read_events(run.events_path)
    gns = events[events.phase == "gns"]
    assert (gns.b_small == 32).all() and (gns.b_big == 64).all()
    check_against_the_model(events, b_small=32, b_big=64)
    with pytest.raises(ConfigError, match="logging.noise_scale_batch needs workers 1"):
        from_mapping(ADASCALE, ["logging.noise_scale_batch=64", "workers=2"])
    with pytest.raises(ConfigError, match="noise_scale_batch=8192 is larger than the 4000"):
        RunPlan.of(from_mapping(ADASCALE, ["logging.noise_scale_batch=8192"]), NUM_TRAIN)


def test_an_adascale_run_ends_with_a_checkpoint_at_its_last_update(one_worker):
    run, events = one_worker
    last_step = int(events[events.phase == "train"].step.max())
    epochs = last_step / (NUM_TRAIN // 256)
    assert 2 < epochs < 16  # more epochs of its own than the base run's 2, fewer than S x 2
    checkpoint = sorted(run.checkpoints_path.glob("epoch-*"))[-1]
    assert checkpoint.name == f"epoch-{math.ceil(epochs):04d}"
    position = (checkpoint / "position.json").read_text()
    assert f'"step": {last_step}' in position
    with np.load(checkpoint / "state.npz") as state:
        tau = float(events[events.phase == "train"].tau.iloc[-1])
        assert tau in [float(state[k]) for k in state.files if state[k].ndim == 0]
    assert events[events.phase == "eval"].step.iloc[-1] == last_step


def test_at_scale_one_it_trains_exactly_like_the_base_optimizer(tmp_path):
    """``base_batch`` = the global batch: the gain is 1, the clock counts updates, and the
    weights and losses are the base schedule's, bit for bit."""
    from toolkit.train import train

    at_one = {**ADASCALE, "batch": {"global_size": 64}, "epochs": 1}
    ada = from_mapping({**at_one, "lr_scaling": {"rule": "adascale", "base_batch": 64}})
    base = from_mapping({**at_one, "lr_scaling": {"rule": "none"}})
    runs = [train(c, tmp_path / c.lr_scaling.rule, verbose=0) for c in (ada, base)]
    a, b = (read_events(r.events_path) for r in runs)
    ta, tb = a[a.phase == "train"], b[b.phase == "train"]
    assert (ta.gain == 1.0).all() and ta.tau.tolist() == ta.step.astype(float).tolist()
    np.testing.assert_array_equal(ta.lr, tb.lr)
    np.testing.assert_array_equal(ta.loss, tb.loss)
    np.testing.assert_array_equal(a[a.phase == "eval"].loss, b[b.phase == "eval"].loss)
    weights = [np.load(r.checkpoints_path / "epoch-0001" / "optimizer.npz") for r in runs]
    for key in weights[1].files:
        np.testing.assert_array_equal(weights[0][key], weights[1][key])


WORKER_BACKENDS = backends_running(adascale=True)


def complete_and_resumed(config, root, backend: str):
    """``config`` launched on ``backend``, in ``root``, to its end, and a copy of it resumed
    from its next-to-last checkpoint (:func:`test_train.resume_a_copy`)."""
    from test_train import resume_a_copy, wait

    from toolkit.launching import launch as launcher

    complete = launcher.launch(config, runs_root_dir=root, run_id="complete", backend=backend)
    assert wait(complete)["state"] == "completed", complete.stdout_path.read_text()[-3000:]
    return complete, resume_a_copy(complete, run_id="resumed")


@pytest.fixture(scope="module", params=WORKER_BACKENDS)
def two_workers(request, tmp_path_factory, subprocess_env):
    """A complete 2-worker AdaScale run, and a copy of it resumed from its next-to-last
    checkpoint, on each of :data:`WORKER_BACKENDS` (about 15 s, 20-26 s on PyTorch and JAX)."""
    import os

    os.environ["PATH"] = subprocess_env["PATH"]
    config = from_mapping({**ADASCALE, "workers": 2})
    return complete_and_resumed(config, tmp_path_factory.mktemp(request.param), request.param)


def test_two_workers_log_what_the_numpy_model_of_adascale_computes(two_workers):
    complete, _ = two_workers
    events, backend = read_events(complete.events_path), backends.recorded(complete.meta())
    check_against_the_model(events, b_small=128, b_big=256, backend=backend)
    log = complete.stdout_path.read_text()
    assert "τ" in log and "gain" in log  # its progress is on AdaScale's clock


def test_a_stopped_and_resumed_adascale_run_continues_bit_for_bit(two_workers):
    complete, resumed = two_workers
    assert_resumed_bit_for_bit(
        complete, resumed, {"train": ["loss", "lr", "gain", "tau"], "eval": ["loss"]}
    )


def assert_resumed_bit_for_bit(complete, resumed, columns_by_phase: dict[str, list[str]]):
    """The resumed run logged the complete run's values of ``columns_by_phase`` at the same
    steps, and its last checkpoint holds the same optimizer and AdaScale state, bit for bit."""
    a, b = read_events(complete.events_path), read_events(resumed.events_path)
    for phase, columns in columns_by_phase.items():
        x, y = a[a.phase == phase], b[b.phase == phase]
        assert x.step.tolist() == y.step.tolist()
        for column in columns:
            np.testing.assert_array_equal(y[column], x[column], err_msg=column)
    last = sorted(complete.checkpoints_path.glob("epoch-*"))[-1].name
    for name in ("optimizer.npz", "state.npz"):
        with (
            np.load(complete.checkpoints_path / last / name) as want,
            np.load(resumed.checkpoints_path / last / name) as got,
        ):
            for key in want.files:
                np.testing.assert_array_equal(got[key], want[key], err_msg=f"{name} {key}")


@pytest.mark.parametrize(
    "change, field",
    [
        (["sync.mode=partial"], "sync.mode='full'"),
        (["allreduce.compression=topk"], "allreduce.compression 'none' or 'fp16'"),
        (["steps_per_epoch=10"], "no steps_per_epoch cap"),
        (["lr_scaling.base_batch=512"], "at least lr_scaling.base_batch=512"),
        (
            ["batch.global_size=null", "batch.per_worker=1", "lr_scaling.base_batch=1"],
            "batch.per_worker must be at least 2",
        ),
    ],
)
def test_what_adascale_cannot_do_is_refused_naming_the_field(change, field):
    with pytest.raises(ConfigError, match="lr_scaling.rule='adascale'") as error:
        from_mapping(ADASCALE, change)
    assert field in str(error.value)


def test_the_noise_scale_interval_is_auto_by_default():
    config = from_mapping(ADASCALE, ["logging.noise_scale_every_steps=auto"])
    assert sections.LoggingConfig().noise_scale_every_steps == "auto"
    assert Scale.of(config, 1).noise_every == 100  # an extra gradient each
    assert Scale.of(config, 2).noise_every == 25  # free in the allreduce
    assert Scale.of(from_mapping(ADASCALE), 1).noise_every == 1  # a number means that number
    with pytest.raises(ConfigError, match="noise_scale_every_steps"):
        from_mapping(ADASCALE, ["logging.noise_scale_every_steps=sometimes"])


def test_run_detail_draws_the_real_runs_gain_against_s_and_its_clock(one_worker, monkeypatch):
    from test_app import decode, figures, page

    from app import charts

    run, events = one_worker
    monkeypatch.setenv("LBL_RUNS", str(run.path.parent))
    at = page("detail")
    drawn = {f["layout"]["title"]["text"]: f for f in figures(at)}
    raw, gain, scale = drawn["AdaScale's gain against S"]["data"]  # the gain smoothed, S not
    train = events[events.phase == "train"]
    np.testing.assert_array_equal(decode(raw["y"]), train.gain)
    np.testing.assert_allclose(decode(gain["y"]), charts.ema(train.gain, charts.SMOOTHING))
    assert scale["name"] == "S = 8" and set(decode(scale["y"])) == {8.0}
    clock = drawn["AdaScale's clock τ (base-run updates)"]["data"][0]
    np.testing.assert_array_equal(decode(clock["y"]), train.tau)
    said = " ".join(m.value for m in at.markdown).replace("\\", "")  # md-escaped
    assert "AdaScale's gain (base batch 32)" in said and "the base run's 2 epochs" in said
    assert any("τ 250 of 250 base-run updates" in p.text for p in at.get("progress"))


def test_the_runs_table_shows_an_adascale_runs_own_epochs_and_its_clock(one_worker):
    from toolkit.runs import table

    run, events = one_worker
    row = table.summary(run, events)
    epochs = events[events.phase == "train"].epoch.iloc[-1]
    assert table.progress_text(row) == f"{round(epochs, 2):g} epochs, τ 100%"


def poly(lr, total, power=2.0):
    return lambda tau: lr * max(0.0, 1 - tau / total) ** power


def multifactor(lr, milestones, factor):
    return lambda tau: lr * factor ** sum(tau > m for m in milestones)


@pytest.mark.parametrize(
    "optimizer, schedule, base_rate",
    [
        (
            {"name": "lars", "learning_rate": 0.2, "params": {"trust_coefficient": 0.02}},
            {"name": "poly", "params": {"power": 2}},
            poly(0.2, 125),
        ),
        (
            {"name": "lbsgd", "learning_rate": 0.05, "params": {"warmup_strategy": "lars"}},
            {"name": "multifactor", "params": {"epochs": [0.4, 0.8], "factor": 0.5}},
            multifactor(0.05, [50, 100], 0.5),
        ),
    ],
    ids=["lars-poly", "lbsgd-multifactor"],
)
def test_every_sgd_family_optimizer_and_schedule_reads_its_rate_on_the_clock(
    optimizer, schedule, base_rate, tmp_path
):
    """LARS with a polynomial decay and LBSGD (``lars`` warmup) with step decay: each update's
    rate is its gain times the base schedule at the clock before it, and the run ends on the
    clock."""
    from toolkit.train import train

    config = from_mapping(
        {
            **ADASCALE,
            "optimizer": optimizer,
            "schedule": schedule,
            "batch": {"global_size": 128},
            "epochs": 1,  # the base run: 4000 // 32 = 125 updates
        }
    )
    events = read_events(train(config, tmp_path / "run", verbose=0).events_path)
    train_events = events[events.phase == "train"]
    gains, taus = train_events.gain.to_numpy(), train_events.tau.to_numpy()
    read_at = np.concatenate([[0.0], taus[:-1]])
    expected = gains * np.array([base_rate(t) for t in read_at])
    np.testing.assert_allclose(train_events.lr, expected, rtol=1e-5, atol=1e-7)
    assert taus[-1] >= 125 > taus[-2] and gains.max() > 1
