"""Two workers on Keras's JAX backend through JAX's own engine (``toolkit/parallel/jax_engine.py``),
launched as any run is (real ``horovodrun``, 2 Gloo workers on this machine): the run a one-worker
run at the same global batch is, step for step; resumed from a checkpoint, the run it would have
been; the noise scale said to be unmeasured; the same run on two hosts over ssh, on the
namespace cluster. Cost: about 90 s (4 short runs on 2 cores)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import ROOT
from test_train import stop_after_the_first_checkpoint_and_resume, wait

from toolkit.config import load
from toolkit.launching import launch as launcher
from toolkit.runs.events import read_events
from toolkit.runs.table import summary
from toolkit.training.trainer import NO_NOISE_SCALE_ON_JAX

EPOCHS = 6
STEPS = EPOCHS * 4000 // 32  # global batch 32: 2 workers of 16, or 1 of 32


def short(*changes: str):
    """The quickstart, :data:`EPOCHS` epochs long with a checkpoint each, without warm-up."""
    shortened = [f"epochs={EPOCHS}", "checkpoint.every_epochs=1", "schedule.warmup.epochs=0"]
    return load(ROOT / "experiments/quickstart.yaml", [*shortened, *changes])


@pytest.fixture(scope="module")
def on_jax(tmp_path_factory):
    """``launch(id, *changes, **where)`` starts :func:`short`'s quickstart on JAX (``where``:
    :func:`launch`'s hosts) and returns its run. The runs root is on the file system the
    cluster's hosts share."""
    root = tmp_path_factory.mktemp("jax-runs")

    def launch(run_id: str, *changes: str, **where):
        return launcher.launch(
            short(*changes), runs_root_dir=root, run_id=run_id, backend="jax", **where
        )

    return launch


@pytest.fixture(scope="module")
def two_and_one(on_jax):
    """The quickstart on 2 workers of 16 examples, and on 1 worker of 32, both completed."""
    runs = (
        on_jax("two", "workers=2", "batch.per_worker=16"),
        on_jax("one", "workers=1", "batch.per_worker=32"),
    )
    for run in runs:
        assert wait(run)["state"] == "completed", run.stdout_path.read_text()[-3000:]
    return runs


def train_losses(run):
    events = read_events(run.events_path)
    return events[events.phase == "train"].set_index("step").loss


def test_two_workers_train_as_one_worker_of_their_global_batch(two_and_one):
    two, one = two_and_one
    assert two.meta()["versions"]["keras_backend"] == "jax" and two.meta()["world_size"] == 2
    assert two.status()["world_size"] == 2 and one.status()["world_size"] == 1
    assert summary(two)["backend"] == "jax"  # the runs table's column
    losses, alone = train_losses(two), train_losses(one)
    assert losses.index.tolist() == alone.index.tolist() == list(range(10, STEPS + 1, 10))
    # the same mean over the same 32 examples, every update, summed in another order: equal
    # to float32's rounding at first, the difference then growing as training amplifies it
    np.testing.assert_allclose(losses[:50], alone[:50], rtol=1e-6)
    np.testing.assert_allclose(losses, alone, rtol=1e-2)
    assert losses.iloc[-1] < 0.8 * losses.iloc[0]  # and it learned


def test_the_noise_scale_is_said_not_measured_with_several_workers_on_jax(two_and_one):
    two, one = two_and_one
    assert NO_NOISE_SCALE_ON_JAX in two.stdout_path.read_text()
    assert "gns" not in set(read_events(two.events_path).phase)
    assert NO_NOISE_SCALE_ON_JAX not in one.stdout_path.read_text()


def test_a_stopped_two_worker_run_resumes_into_the_run_it_would_have_been(
    two_and_one, on_jax, monkeypatch
):
    """Resumed from a shell whose ``KERAS_BACKEND`` is another: it resumes on JAX, the backend
    it was launched on."""
    two, _ = two_and_one
    run = on_jax("resumed", "workers=2", "batch.per_worker=16")
    assert run.meta()["keras_backend"] == "jax"
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    stop_after_the_first_checkpoint_and_resume(run)
    log = run.stdout_path.read_text()
    assert re.search(f"resuming from checkpoint epoch-000[1-{EPOCHS - 1}]", log), log[-3000:]
    np.testing.assert_array_equal(train_losses(run), train_losses(two))
    with (
        np.load(two.checkpoints_path / f"epoch-{EPOCHS:04d}" / "optimizer.npz") as want,
        np.load(run.checkpoints_path / f"epoch-{EPOCHS:04d}" / "optimizer.npz") as got,
    ):
        for key in want.files:  # step counter, velocities and trust ratios, bit for bit
            np.testing.assert_array_equal(got[key], want[key])


def test_the_same_run_on_two_hosts_over_ssh(two_and_one, on_jax, cluster_hosts):
    """(As a Slurm job of two nodes: ``tests/test_slurm.py``.)"""
    two, _ = two_and_one
    run = on_jax("hosts", "workers=2", "batch.per_worker=16", hosts="lbl-h1:1,lbl-h2:1")
    assert wait(run)["state"] == "completed", run.stdout_path.read_text()[-3000:]
    workers = [p for p in run.recorded_status()["processes"] if p["role"] == "worker"]
    assert sorted(p["host"] for p in workers) == ["lbl-h1", "lbl-h2"], workers
    np.testing.assert_allclose(train_losses(run), train_losses(two), rtol=1e-6)
