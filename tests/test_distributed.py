"""Horovod glue under real ``horovodrun`` with 2 Gloo workers on localhost."""

from __future__ import annotations

import json
import subprocess
import sys

import keras
import numpy as np
import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tests" / "workers"))
from scenarios import GLOBAL_BATCH, STEPS, global_data, make_model  # noqa: E402

from toolkit import distributed  # noqa: E402


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory, subprocess_env):
    out = tmp_path_factory.mktemp("hvd")
    env = subprocess_env
    result = subprocess.run(
        [
            "horovodrun",
            "--gloo",
            "-np",
            "2",
            "-H",
            "localhost:2",
            sys.executable,
            str(ROOT / "tests/workers/averaging.py"),
            str(out),
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = [np.load(out / f"rank{r}.npz") for r in range(2)]
    infos = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return ranks, infos


def weights(npz, scenario):
    keys = sorted(
        (k for k in npz.files if k.startswith(f"{scenario}/")),
        key=lambda k: int(k.split("/")[1]),
    )
    return [npz[k] for k in keys]


def reference(batches):
    """One worker, the whole global batch per step (batches: list of row ranges)."""
    x, y = global_data()
    model = make_model(seed=100, optimizer=keras.optimizers.SGD(0.5))
    for rows in batches:
        model.train_on_batch(x[rows], y[rows])
    return model.get_weights()


def test_really_two_workers(two_workers):
    _, infos = two_workers
    assert [i["size"] for i in infos] == [2, 2]


@pytest.mark.parametrize("scenario", ["sgd", "accumulate2", "fp16", "fit"])
def test_workers_started_with_different_seeds_end_identical(two_workers, scenario):
    ranks, _ = two_workers
    for a, b in zip(weights(ranks[0], scenario), weights(ranks[1], scenario)):
        np.testing.assert_array_equal(a, b)


def test_two_workers_of_batch_b_equal_one_worker_of_batch_2b(two_workers):
    ranks, _ = two_workers
    expected = reference(
        [slice(s * GLOBAL_BATCH, (s + 1) * GLOBAL_BATCH) for s in range(STEPS)]
    )
    for got, want in zip(weights(ranks[0], "sgd"), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    initial = make_model(seed=100, optimizer=keras.optimizers.SGD(0.5)).get_weights()
    assert not np.allclose(expected[0], initial[0])


def test_accumulating_two_local_steps_is_one_step_on_the_four_half_batches(two_workers):
    """backward_passes_per_step=2 with 2 workers: each update averages 4 half-batches, i.e. one
    step on a batch of 2 x GLOBAL_BATCH."""
    ranks, _ = two_workers
    expected = reference(
        [slice(s * 2 * GLOBAL_BATCH, (s + 1) * 2 * GLOBAL_BATCH) for s in range(STEPS)]
    )
    for got, want in zip(weights(ranks[0], "accumulate2"), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_fp16_compression_stays_close(two_workers):
    ranks, _ = two_workers
    for fp16, full in zip(weights(ranks[0], "fp16"), weights(ranks[0], "sgd")):
        np.testing.assert_allclose(fp16, full, rtol=1e-2, atol=1e-3)


def test_metric_averaging_reports_the_same_epoch_loss_on_every_rank(two_workers):
    _, infos = two_workers
    assert infos[0]["logs"]["loss"] == infos[1]["logs"]["loss"]


def test_single_process_without_horovodrun(tmp_path):
    assert (
        distributed.size() == 1 and distributed.rank() == 0 and distributed.is_rank0()
    )
    x, y = global_data()
    model = make_model(seed=1, optimizer=keras.optimizers.SGD(0.1, momentum=0.9))
    model.fit(
        x,
        y,
        batch_size=32,
        epochs=1,
        verbose=0,
        callbacks=[
            distributed.BroadcastInitialState(),
            distributed.MetricAverageCallback(),
        ],
    )
    assert type(model.optimizer).__name__ == "SGD"
    model.save(tmp_path / "m.keras")
    restored = keras.models.load_model(tmp_path / "m.keras")
    assert isinstance(restored.optimizer, keras.optimizers.SGD)
    assert int(restored.optimizer.iterations) == int(model.optimizer.iterations) > 0


def test_accumulation_is_refused_for_optimizers_that_accumulate_themselves():
    from toolkit.optimizers import LBSGD

    with pytest.raises(ValueError, match="batch_scale"):
        distributed.DistributedOptimizer(
            LBSGD(batch_scale=2), backward_passes_per_step=2
        )
    with pytest.raises(ValueError, match="compression must be one of"):
        distributed.DistributedOptimizer(keras.optimizers.SGD(), compression="int8")
