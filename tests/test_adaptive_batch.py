"""The adaptive batch (``batch.adaptive``) against oracles written out here: its decision rule
against a table, its variable-count accumulation against Keras's own (fixed) accumulation, and
real runs, on one worker and on two under horovodrun, whose batch grows while a numpy replay of
plain SGD on the examples each update claims (the mean over all of them, whichever worker and
step they came from) reproduces the trained weights. AdaScale's logged gains and clocks follow
the numpy model of Algorithm 1 with the batch of each update, and a run resumed from a
checkpoint continues bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import backends_running
from test_adascale import (
    assert_resumed_bit_for_bit,
    complete_and_resumed,
    state_rtol,
)
from test_adascale_gain import numpy_adascale

from toolkit import backends
from toolkit.config import ConfigError, from_mapping
from toolkit.plan import RunPlan, Scale
from toolkit.runs.events import read_events
from toolkit.scaling.adaptive_batch import Accumulation, accumulate, next_batch
from toolkit.training import experiment

ADAPTIVE = {  # logistic regression on digits: its B_simple passes 16, 32 and 64 in 3 epochs
    "name": "adaptive",
    "dataset": {"name": "digits"},
    "model": {"name": "logreg"},
    "optimizer": {"name": "sgd", "learning_rate": 0.1},
    "schedule": {"name": "constant"},
    "batch": {"per_worker": 8, "adaptive": {"min": 16, "max": 128}},
    "lr_scaling": {"rule": "adascale", "base_batch": 16},
    "workers": 2,
    "epochs": 3,
    "logging": {"every_steps": 1, "noise_scale_every_steps": 1, "noise_scale_smoothing": 0.9},
}


@pytest.mark.parametrize(
    "b_simple, current, expected",
    [
        (float("nan"), 256, 256),  # nothing measured yet: keep
        (-40.0, 256, 256),  # noise estimated below zero: keep
        (0.0, 256, 256),
        (1.0, 256, 128),  # at most halved
        (100.0, 256, 128),  # 128 is nearest, and half of 256
        (100.0, 128, 128),  # nearest 128: kept
        (190.0, 256, 128),  # 128 is nearer than 256 (62 against 66)
        (200.0, 256, 256),  # 256 is nearer than 128 (56 against 72)
        (383.0, 256, 256),  # below the midpoint 384
        (384.0, 256, 512),  # the midpoint: a tie goes to the larger
        (600.0, 256, 512),  # nearest 512
        (1e5, 256, 512),  # at most doubled
        (1e5, 1024, 1024),  # at most max
        (3.0, 64, 64),  # at least min
    ],
)
def test_the_decision_rule_against_a_table(b_simple, current, expected):
    assert next_batch(b_simple, current, 64, 1024) == expected


@pytest.mark.parametrize(
    "b_simple, current, aim, hysteresis, expected",
    [
        (100.0, 128, 3.5, 0.0, 256),  # aims at 350: up
        (40.0, 256, 3.5, 0.0, 128),  # aims at 140, below 192
        (40.0, 256, 3.5, 0.5, 128),  # 140 is below 0.625 x 256 = 160 too
        (50.0, 256, 3.5, 0.5, 256),  # 175: past the midpoint 192, not past 160
        (250.0, 128, 1.0, 1.0, 128),  # up only at 256 itself
        (256.0, 128, 1.0, 1.0, 256),
        (70.0, 128, 1.0, 1.0, 128),  # down only at 64 itself (70 < 96 would halve it at 0)
        (63.0, 128, 1.0, 1.0, 64),
        (1e5, 512, 2.0, 0.5, 1024),  # still at most doubled, at most max
        (1e5, 1024, 2.0, 0.5, 1024),
    ],
)
def test_the_aim_and_the_hysteresis_against_a_table(b_simple, current, aim, hysteresis, expected):
    assert next_batch(b_simple, current, 64, 1024, aim, hysteresis) == expected


def test_hysteresis_stops_a_noisy_b_simple_at_a_midpoint_moving_the_batch_back_and_forth():
    readings = [200.0, 185.0] * 5  # either side of 192, the midpoint of 128 and 256
    for hysteresis, expected in ((0.0, [256, 128] * 5), (0.5, [128] * 10)):
        batch, batches = 128, []
        for b_simple in readings:
            batch = next_batch(b_simple, batch, 16, 4096, 1.0, hysteresis)
            batches.append(batch)
        assert batches == expected


def test_the_power_of_two_is_the_nearest_one_for_every_b_simple():
    """From the nearest power itself, so that the 2x window still offers both neighbours."""
    powers = 2 ** np.arange(14)
    for b_simple in np.geomspace(1.1, 5000, 400):
        distances = np.abs(powers - b_simple)
        nearest = int(powers[distances == distances.min()].max())
        assert next_batch(b_simple, nearest, 1, 2**20) == nearest, b_simple


def tiny_model():
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])


def fit(model, optimizer, x, y):
    import keras

    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    return model


@pytest.mark.parametrize("steps", [1, 2, 4])
def test_a_variable_count_accumulates_exactly_as_keras_does(steps):
    import keras

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4)).astype("float32"), rng.integers(0, 3, 64)
    keras_steps = steps if steps > 1 else None
    reference = keras.optimizers.SGD(0.1, momentum=0.9, gradient_accumulation_steps=keras_steps)
    want = fit(tiny_model(), reference, x, y)
    model, optimizer = tiny_model(), keras.optimizers.SGD(0.1, momentum=0.9)
    accumulate(optimizer, Accumulation(8, 1, steps), model.trainable_variables)
    got = fit(model, optimizer, x, y)
    for a, b in zip(want.get_weights(), got.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(optimizer.iterations) == int(reference.iterations) == 8 // steps


def test_the_count_changes_between_updates_without_retracing():
    import keras

    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(64, 4)).astype("float32"), rng.integers(0, 3, 64)
    model, optimizer = tiny_model(), keras.optimizers.SGD(0.1)
    accumulation = Accumulation(8, 1, 1)
    accumulate(optimizer, accumulation, model.trainable_variables)
    traces = []
    apply = optimizer.apply
    optimizer.apply = lambda grads, variables=None: (traces.append(1), apply(grads, variables))[1]
    fit(model, optimizer, x, y)  # 8 updates of one step
    accumulation.switch(8, 32)  # then 4 steps each, through the same compiled step
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert int(optimizer.iterations) == 8 + 2 and len(traces) == 1
    assert (
        accumulation.updates(16) == 10
        and accumulation.updates(8) == 8
        and accumulation.updates(4) == 4
    )
    assert (
        accumulation.step_of(10) == 16
        and accumulation.starts_update(12)
        and not accumulation.starts_update(13)
    )


def test_an_accumulation_counts_updates_across_its_changes():
    accumulation = Accumulation(per_worker=16, world=4, steps_per_update=1)
    assert accumulation.global_batch == 64 and accumulation.noise_batches() == (16, 64)
    accumulation.switch(100, 256)  # 4 steps per update from step 100
    assert accumulation.global_batch == 256 and accumulation.noise_batches() == (64, 256)
    assert accumulation.updates(100) == 100 and accumulation.updates(106) == 101.5
    assert accumulation.updates(50) == 50  # before the change: its own stretch
    accumulation.switch(108, 128)
    assert (
        accumulation.updates(110) == 103
        and accumulation.updates(104) == 101
        and accumulation.step_of(104) == 112
    )
    with pytest.raises(ValueError, match="end of an update"):
        accumulation.switch(111, 256)
    with pytest.raises(ValueError, match="multiple of 64"):
        accumulation.switch(110, 96)
    one = Accumulation(per_worker=32, world=1, steps_per_update=4)
    assert one.global_batch == 128 and one.noise_batches() == (16, 32)  # halves of a step


@pytest.mark.parametrize(
    "change, field",
    [
        (["lr_scaling.rule=linear"], "lr_scaling.rule='adascale'"),
        (["batch.accumulation=2"], "batch.accumulation 1"),
        (["batch.global_size=64"], "no batch.global_size"),
        (["optimizer.name=lbsgd", "optimizer.params={}"], "other than lbsgd"),
        (["precision=mixed_float16"], "precision='float32'"),
        (["batch.per_worker=16", "batch.adaptive.min=16"], "multiple of batch.per_worker x"),
    ],
)
def test_what_the_adaptive_batch_cannot_do_is_refused_naming_the_field(change, field):
    with pytest.raises(ConfigError, match="batch.adaptive needs") as error:
        from_mapping(ADAPTIVE, change)
    assert field in str(error.value)


@pytest.mark.parametrize(
    "change, message",
    [
        (["batch.adaptive.min=24"], "power of two"),
        (["batch.adaptive.max=8", "batch.adaptive.min=16"], "min=16 must be at most max=8"),
        (["batch.adaptive.every_epochs=0"], "every_epochs"),
        (["batch.adaptive.aim=0"], "aim"),
        (["batch.adaptive.hysteresis=1.5"], "hysteresis"),
    ],
)
def test_bad_adaptive_fields_are_named(change, message):
    with pytest.raises(ConfigError, match="batch.adaptive") as error:
        from_mapping(ADAPTIVE, change)
    assert message in str(error.value)


def test_an_adaptive_epoch_is_whole_updates_at_its_largest_batch():
    config = from_mapping(ADAPTIVE)
    # 1437 examples: 718 per worker, 89 steps of 8, cut to 88: a multiple of 128 / 16 = 8
    assert RunPlan.of(config, 1437, 2).steps_per_epoch == 88
    assert Scale.of(config, 2).global_batch == 16 and Scale.of(config, 2).steps_per_update == 1
    with pytest.raises(ConfigError, match="batch.adaptive.max=2048 is larger"):
        RunPlan.of(from_mapping(ADAPTIVE, ["batch.adaptive.max=2048"]), 1437, 2)


def softmax_regression_replay(config, events, checkpoint):
    """Plain SGD on softmax regression in float64, from the weights of ``checkpoint`` (one of
    the run's, so that no backend's initializers are needed here), over the run's data order:
    each update's gradient is the mean over every example of the steps it claims on every
    worker (``global_batch / (per_worker x workers)`` steps, from the train events), at the rate
    the run logged for it. Returns the weights after the last step."""
    world = config.workers
    dataset = experiment.load_dataset(config)
    model = experiment.build_model(config, dataset)
    model.load_weights(checkpoint / "model.weights.h5")
    kernel, bias = (w.astype(np.float64) for w in model.get_weights())
    plan = RunPlan.of(config, len(dataset.x_train), world)
    spe = plan.steps_per_epoch
    train = events[events.phase == "train"].set_index("step")
    step_batch = config.batch.per_worker * world
    step = int(checkpoint.name.removeprefix("epoch-")) * spe
    while step < train.index.max():
        epoch, first = divmod(step, spe)
        batches = [
            list(experiment.train_batches(plan, dataset, epoch, seed=config.seed, rank=rank))
            for rank in range(world)
        ]
        while first < spe and step < train.index.max():
            count = int(train.global_batch[step + 1]) // step_batch
            claimed = [b for rank in batches for b in rank[first : first + count]]
            x = np.concatenate([b[0].numpy().reshape(len(b[0]), -1) for b in claimed])
            y = np.concatenate([b[1].numpy() for b in claimed])
            logits = x.astype(np.float64) @ kernel + bias
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            p[np.arange(len(y)), y] -= 1
            step, first = step + count, first + count
            rate = train.lr[step]
            kernel -= rate * x.T @ p / len(y)
            bias -= rate * p.mean(axis=0)
    return kernel, bias


def check_the_run(config, run):
    """The batch grew at epoch starts, by at most 2x, every update's gradient was the mean over
    its examples (the numpy replay reaches the saved weights), and AdaScale's gains and clock
    are the numpy model's with each update's batch."""
    import keras

    events = read_events(run.events_path)
    train, gns = events[events.phase == "train"], events[events.phase == "gns"]
    evals = events[events.phase == "eval"]
    assert train.global_batch.notna().all() and evals.global_batch.notna().all()
    spe = RunPlan.of(config, 1437).steps_per_epoch
    batches = train.drop_duplicates("global_batch")
    assert batches.global_batch.tolist() == [16, 32, 64, 128]  # grew, doubling each time
    assert ((batches.step - 1) % spe == 0).all()  # at epoch starts only

    first, *_, last = sorted(run.checkpoints_path.glob("epoch-*"))
    kernel, bias = softmax_regression_replay(config, events, first)
    model = experiment.build_model(config, experiment.load_dataset(config))
    model.load_weights(last / "model.weights.h5")
    got_kernel, got_bias = (keras.ops.convert_to_numpy(w) for w in model.weights)
    np.testing.assert_allclose(got_kernel, kernel, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_bias, bias, rtol=1e-4, atol=1e-5)

    # one gns event per update, at the update's last step, with that update's batches
    ends = train[train.step.isin(gns.step)]
    assert len(ends) == len(gns) and (ends.step.diff().dropna() > 0).all()
    batch = ends.global_batch.to_numpy()
    halves = np.full(len(batch), config.batch.per_worker / 2)  # one worker: a step's halves
    expected_small = batch / 2 if config.workers > 1 else halves
    np.testing.assert_array_equal(gns.b_small, expected_small)
    gains, _, taus = numpy_adascale(
        gns.small_sq.to_numpy(),
        gns.big_sq.to_numpy(),
        b_small=gns.b_small.to_numpy(),
        b_big=gns.b_big.to_numpy(),
        base_batch=16,
        batch=batch,
        decay=0.9,
        base_rate=lambda tau: 0.1,
    )
    rtol = state_rtol(backends.recorded(run.meta()))
    np.testing.assert_allclose(ends.gain, gains, rtol=rtol)
    np.testing.assert_allclose(ends.tau, taus, rtol=rtol)
    assert taus[-1] >= 3 * (1437 // 16) > taus[-2]


@pytest.fixture(scope="module", params=backends_running(adaptive_batch=True))
def two_workers(request, tmp_path_factory, subprocess_env):
    """A complete 2-worker adaptive run, and a copy of it resumed from its next-to-last
    checkpoint (after the batch changed, so the resumed run restores a changed plan), on each
    of the backends whose workers run it (about 18 s, 23-25 s on PyTorch and JAX)."""
    import os

    os.environ["PATH"] = subprocess_env["PATH"]
    config = from_mapping(ADAPTIVE)
    root = tmp_path_factory.mktemp(request.param)
    return config, *complete_and_resumed(config, root, request.param)


def test_two_workers_grow_the_batch_and_each_update_is_the_mean_of_its_examples(two_workers):
    config, complete, _ = two_workers
    check_the_run(config, complete)
    log = complete.stdout_path.read_text()
    assert "global batch 16 -> 32" in log and "global batch 64 -> 128" in log


def test_one_worker_grows_the_batch_the_same_way(tmp_path):
    from toolkit.train import train

    config = from_mapping(ADAPTIVE, ["workers=1", "batch.per_worker=16"])
    check_the_run(config, train(config, tmp_path / "one", verbose=0))


def test_a_stopped_and_resumed_adaptive_run_continues_bit_for_bit(two_workers):
    _, complete, resumed = two_workers
    columns = {
        "train": ["loss", "lr", "gain", "tau", "global_batch"],
        "eval": ["loss", "global_batch"],
        "gns": ["small_sq", "big_sq", "b_small", "b_big"],
    }
    assert_resumed_bit_for_bit(complete, resumed, columns)


def test_run_detail_draws_the_global_batch_as_it_grew(two_workers, monkeypatch):
    from test_app import decode, figures, page

    _, complete, _ = two_workers
    monkeypatch.setenv("LBL_RUNS", str(complete.path.parent))
    at = page("detail")
    at.selectbox[0].set_value("complete").run()
    drawn = {f["layout"]["title"]["text"]: f for f in figures(at)}
    events = read_events(complete.events_path)
    train = events[events.phase == "train"]
    noise = {s["name"]: s for s in drawn["B_simple against the global batch"]["data"]}
    np.testing.assert_array_equal(decode(noise["global batch"]["y"]), train.global_batch)
    gain = {s["name"]: s for s in drawn["AdaScale's gain against S"]["data"]}
    np.testing.assert_array_equal(decode(gain["S"]["y"]), train.global_batch / 16)
    said = " ".join(m.value for m in at.markdown).replace("\\", "")
    assert "adaptive global batch 16 to 128 (every epoch)" in said


def test_a_probe_measures_an_adaptive_config_at_its_first_batch(tmp_path):
    from toolkit.launching.probe import probe

    config = from_mapping(ADAPTIVE, ["workers=1", "batch.adaptive.min=32"])
    result = probe(config, steps=30, runs_root=tmp_path)
    assert result.global_batch == 32 and result.b_simple > 0
