"""Training runs end to end: ``toolkit.launching.launch`` -> supervisor -> horovodrun (2 Gloo
workers)
-> ``toolkit.train``, and what they leave in the run directory."""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import psutil
import pytest
from conftest import ROOT

from toolkit import backends
from toolkit.config import from_mapping
from toolkit.launching import launch as launcher
from toolkit.plan import Scale
from toolkit.runs.events import read_events
from toolkit.runs.rundir import TERMINAL, RunDir
from toolkit.runs.states import State
from toolkit.runs.table import summary

SMALL = {
    "name": "small",
    "dataset": {"name": "mnist1d"},
    "model": {"name": "cnn1d"},
    "optimizer": {
        "name": "lars",
        "learning_rate": 0.2,
        "params": {"momentum": 0.9, "weight_decay": 1e-4, "trust_coefficient": 0.02},
    },
    "schedule": {"name": "cosine", "warmup": {"epochs": 1, "strategy": "sqrt"}},
    "batch": {"per_worker": 32},
    "epochs": 3,
    "workers": 2,
    "logging": {"every_steps": 5, "trust_ratio_every_steps": 20},
    "checkpoint": {"every_epochs": 1},
}


def wait(run: RunDir, states=TERMINAL, timeout=240.0) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        status = run.status()
        if status["state"] in states:
            return status
        time.sleep(0.2)
    raise AssertionError(
        f"{run.run_id} still {run.status()} after {timeout}s:\n"
        + run.stdout_path.read_text()[-3000:]
    )


def stop_after_the_first_checkpoint_and_resume(run: RunDir, epoch: int = 1) -> None:
    """Stop ``run`` as soon as its ``epoch`` checkpoint exists (the first by default), resume it,
    wait until it completes."""
    deadline = time.time() + 240
    while not (run.checkpoints_path / f"epoch-{epoch:04d}").exists():
        assert time.time() < deadline and run.status()["state"] not in TERMINAL
        time.sleep(0.05)
    launcher.stop(run)
    assert wait(run)["state"] == "stopped"
    launcher.resume(run)
    assert wait(run)["state"] == "completed", run.stdout_path.read_text()[-3000:]


def resume_a_copy(complete: RunDir, run_id: str) -> RunDir:
    """A copy of the finished run ``complete``, named ``run_id``, as it stood stopped after the
    earlier of the two checkpoints a run keeps (the last one gone, the state ``stopped``),
    resumed to its end: a run resumed from a checkpoint, without the launch and the epochs of
    :func:`stop_after_the_first_checkpoint_and_resume`, for tests of what a checkpoint carries
    rather than of how a run stops. The resume drops the copied events past the checkpoint's
    step, as it drops those a stopped run logged after its checkpoint."""
    copy = RunDir(shutil.copytree(complete.path, complete.path.parent / run_id))
    *kept, last = sorted(copy.checkpoints_path.glob("epoch-*"))
    assert kept, f"{complete.run_id} kept one checkpoint: nothing to resume from before its end"
    shutil.rmtree(last)
    copy.status_path.unlink()
    copy.set_status(State.STOPPED, reason="stopped by a test")
    copied = time.time()
    launcher.resume(copy)
    assert wait(copy)["state"] == "completed", copy.stdout_path.read_text()[-3000:]
    assert f"resuming from checkpoint {kept[-1].name}" in copy.stdout_path.read_text()
    events = read_events(copy.events_path)
    assert (events.wall > copied).any() and (events.wall < copied).any()  # resumed mid-way
    return copy


@pytest.fixture(scope="module")
def completed(tmp_path_factory, subprocess_env):
    """One complete 2-worker run, shared by the tests that only read it."""
    root = tmp_path_factory.mktemp("runs")
    os.environ["PATH"] = subprocess_env["PATH"]
    run = launcher.launch(from_mapping(SMALL), runs_root_dir=root, run_id="complete")
    status = wait(run)
    assert status["state"] == "completed", run.stdout_path.read_text()[-3000:]
    return run


def test_run_directory_is_complete(completed):
    files = {p.name for p in completed.path.iterdir()}
    assert {
        "config.yaml",
        "meta.json",
        "status.json",
        "events.jsonl",
        "stdout.log",
        "checkpoints",
    } <= files
    meta = completed.meta()
    assert meta["world_size"] == 2 and meta["global_batch"] == 64
    assert meta["versions"]["horovod"] == "0.28.1"
    last_step = read_events(completed.events_path)["step"].max()
    assert meta["total_steps"] == 3 * (2000 // 32) == last_step  # what progress bars count to
    assert completed.status()["exit_code"] == 0
    assert "Epoch 3/3" in completed.stdout_path.read_text()
    assert completed.config() == from_mapping(SMALL)


def test_events_written_once_by_rank0_with_the_scheduled_lr(completed):
    lines = completed.events_path.read_text().splitlines()
    events = read_events(completed.events_path)
    assert len(events) == len(lines)  # every line is valid JSON
    train = events[events.phase == "train"]
    steps_per_epoch = 2000 // 32  # 4000 training examples, 2 workers
    total = 3 * steps_per_epoch
    expected_steps = [s for s in range(5, total + 1, 5)]
    assert train.step.tolist() == expected_steps  # rank 0 only: no step twice
    for step, lr in zip(train.step, train.lr):
        n, warm = step - 1, steps_per_epoch  # the rate used for update number `step`
        cosine = 0.5 * (1 + math.cos(math.pi * n / total))
        expected = 0.2 * cosine * math.sqrt(min(n / warm, 1.0))
        assert lr == pytest.approx(expected, rel=1e-5, abs=1e-8)
    assert (train.samples_per_sec > 0).all() and train.loss.notna().all()
    evals = events[events.phase == "eval"]
    assert evals.epoch.tolist() == [1, 2, 3]
    assert evals.accuracy.iloc[-1] > 0.3  # it learned something (10 classes: chance 0.1)
    ratios = events[events.phase == "trust_ratio"].filter(like="trust_ratio/")
    assert ratios.shape[1] == 4 and (ratios > 0).all().all()  # 3 conv kernels + logits kernel


def test_every_workers_system_metrics_are_logged_at_a_low_rate(completed):
    events = read_events(completed.events_path)
    system = events[events["phase"] == "system"].dropna(axis=1, how="all")
    every = SMALL["logging"]["every_steps"]
    total = completed.meta()["total_steps"]
    expected = sorted({every} | set(range(every * 5, total + 1, every * 5)))  # default: 5 events
    assert system["step"].tolist() == expected
    for rank in (0, 1):
        assert (system[f"cpu_percent/rank{rank}"] >= 0).all()
        assert system[f"memory_gb/rank{rank}"].between(0.1, 64).all()  # a TensorFlow process
        assert system[f"host_memory_percent/rank{rank}"].between(0, 100, inclusive="right").all()
    assert not [c for c in system if "rank2" in c or c.startswith("gpu_")]  # 2 CPU workers
    dense = events[events["phase"] == "train"]["comm/bytes_sent"].iloc[0]  # float32 gradients
    for rank in (0, 1):  # each worker's own count, from its second sample on
        sent = system[f"bytes_sent_per_update/rank{rank}"]
        assert np.isnan(sent.iloc[0]) and (sent.iloc[1:] == dense).all()
    train_steps = set(events[events["phase"] == "train"]["step"])
    assert set(system["step"]) <= train_steps  # with a train event, never on its own


def test_resumed_run_matches_an_uninterrupted_one(completed, runs):
    run = launcher.launch(from_mapping(SMALL), run_id="interrupted")
    stop_after_the_first_checkpoint_and_resume(run)

    a = read_events(completed.events_path)
    b = read_events(run.events_path)
    assert b[b.phase == "train"].step.is_monotonic_increasing  # rewound to the checkpoint
    for phase in ("train", "eval"):
        x, y = a[a.phase == phase], b[b.phase == phase]
        assert x.step.tolist() == y.step.tolist()
        np.testing.assert_array_equal(y.loss, x.loss)
    np.testing.assert_array_equal(b[b.phase == "train"].lr, a[a.phase == "train"].lr)
    x, y = a[a.phase == "gns"], b[b.phase == "gns"]  # measured at the same updates
    assert x.step.tolist() == y.step.tolist() and len(x) == 3 * 62 // 25
    for column in ("small_sq", "big_sq", "b_simple"):  # smoothed on from before the stop
        np.testing.assert_array_equal(y[column], x[column], err_msg=column)
    with (
        np.load(completed.checkpoints_path / "epoch-0003" / "optimizer.npz") as want,
        np.load(run.checkpoints_path / "epoch-0003" / "optimizer.npz") as got,
    ):
        for key in want.files:  # step counter and every momentum buffer, bit for bit
            np.testing.assert_array_equal(got[key], want[key])
    log = run.stdout_path.read_text()
    # exact, so no word of Keras's that it skipped the optimizer's variables ("my momentum
    # is gone"); and the stop asked for is not an error: no traceback of horovodrun's
    assert "Skipping variable loading" not in log and "Traceback" not in log
    assert "horovodrun: SIGTERM received, its workers were ended" in log


def test_killed_worker_leaves_a_failed_run_with_events_and_logs(runs):
    config = from_mapping({**SMALL, "epochs": 50})
    run = launcher.launch(config, run_id="killed")
    wait(run, states=("running",))
    deadline = time.time() + 120
    while not run.events_path.exists() or len(run.events_path.read_text().splitlines()) < 3:
        assert time.time() < deadline
        time.sleep(0.1)
    workers = [
        p
        for p in psutil.Process(run.status()["pid"]).children(recursive=True)
        if "toolkit.train" in " ".join(p.cmdline())
    ]
    rank1 = [p for p in workers if p.environ().get("HOROVOD_RANK") == "1"]
    assert rank1, [p.cmdline() for p in workers]
    rank1[0].send_signal(signal.SIGKILL)
    status = wait(run)
    assert status["state"] == "failed" and status["exit_code"] != 0
    assert len(read_events(run.events_path)) >= 3
    assert run.stdout_path.stat().st_size > 0


def test_nan_loss_stops_the_run_as_failed_with_a_reason(tmp_path, monkeypatch):
    from toolkit.runs import events as events_lib
    from toolkit.train import train
    from toolkit.training.callbacks import NonFiniteLoss

    monkeypatch.setattr(events_lib, "COPY_AFTER", 1)  # any log gets its columnar copy

    config = from_mapping(
        {
            **SMALL,
            "workers": 1,
            "logging": {"every_steps": 1},
            "optimizer": {"name": "sgd", "learning_rate": 1e12},
        }
    )
    with pytest.raises(NonFiniteLoss):
        train(config, tmp_path / "nan", verbose=0)
    status = RunDir(tmp_path / "nan").status()
    assert status["state"] == "failed" and "loss became nan" in status["reason"]
    events = read_events(tmp_path / "nan" / "events.jsonl")
    assert np.isnan(events.loss.iloc[-1])  # the diverged step is in the log
    copy = pd.read_parquet(events_lib.copy_path(tmp_path / "nan" / "events.jsonl"))
    pd.testing.assert_frame_equal(copy, events)  # the failed run's writer closed its copy


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--hosts", "localhost:2;touch /tmp/pwned"],
            "hosts: hosts must be name:slots",
        ),
        (["--set", "optimizer.name=adamx"], "unknown optimizer 'adamx'; choose one of"),
        (["--set", "schedule.warmup.strategy=cubic"], "'linear', 'power2' or 'sqrt'"),
        (["--name", "../escape"], "must match ^[A-Za-z0-9_.-]{1,64}$"),
        (["--np", "4", "--hosts", "localhost:2"], "fewer slots than workers=4"),
        (["--set", "allreduce.ratio=1.5"], "allreduce.ratio: Input should be less than or"),
        (["--set", "allreduce.threshold=0"], "allreduce.threshold: Input should be greater"),
        (
            ["--set", "sync.mode=partial", "--set", "allreduce.compression=topk"],
            "allreduce.compression must be 'none' (got 'topk')",
        ),
    ],
)
def test_bad_input_is_refused_before_anything_starts(args, message, runs, subprocess_env):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolkit",
            "--runs",
            str(runs),
            "launch",
            "experiments/quickstart.yaml",
            *args,
        ],
        cwd=ROOT,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert not runs.exists() or not any(runs.iterdir())


def test_runs_table_shows_times_and_numbers_a_person_can_read(completed, tmp_path):
    from toolkit.terminal import runs_table

    row = summary(completed)
    assert row["epoch"] == completed.config().epochs  # its last epoch's end, not its last step
    table = runs_table(completed.path.parent)
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime(row["started"]))
    assert "started (UTC)" in table and started in table
    assert f" {round(row['duration_s'])} " in table
    assert f" {row['last_eval_accuracy']:.4g} " in table
    assert "e+" not in table  # no epoch seconds or counts in scientific notation

    RunDir.create(tmp_path, "bare")  # no config, status or events: still a row, with gaps
    header, bare = runs_table(tmp_path).splitlines()
    assert bare.split()[0] == "bare" and bare.split().count("-") >= 8
    assert runs_table(tmp_path / "none") == f"no runs under {(tmp_path / 'none').resolve()}"


def test_runs_leaves_probe_runs_out_unless_asked(tmp_path):
    from toolkit.terminal import runs_table

    RunDir.create(tmp_path, "kept")
    RunDir.create(tmp_path, "probe-a").update_meta(probe=True)
    listed = runs_table(tmp_path)
    assert "kept" in listed and "probe-a" not in listed
    assert listed.splitlines()[-1] == "(1 probe run not shown: runs --all)"
    every = runs_table(tmp_path, probes=True)
    assert "kept" in every and "probe-a" in every and "not shown" not in every


def test_cli_launch_wait_shows_progress_and_the_final_state(runs, subprocess_env):
    result = subprocess.run(
        [sys.executable, "-m", "toolkit", "--runs", str(runs), "launch"]
        + ["experiments/quickstart.yaml", "--np", "2", "--set", "epochs=1", "--wait"]
        + ["--tag", "smoke", "--tag", "one epoch", "--note", "launched by the CLI test"],
        cwd=ROOT,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (run,) = [RunDir(p) for p in runs.iterdir()]
    total = run.meta()["total_steps"]
    assert f"{total}/{total}" in result.stdout and "test_acc:" in result.stdout
    assert "\x1b" not in result.stdout and "\r" not in result.stdout  # a pipe: plain lines
    *_, outcome, files, _ = result.stdout.splitlines()  # how it went, and where to look
    row = summary(run)
    accuracy = f"final accuracy {row['last_eval_accuracy']:.4f}"
    assert outcome.startswith(f"{run.run_id}: completed · ") and accuracy in outcome, outcome
    assert files.startswith(f"  its files: {run.path} ")
    said = result.stdout + result.stderr + run.stdout_path.read_text()
    assert "tensorflow/" not in said and "oneDNN" not in said  # no TensorFlow start-up lines
    batch, optimizer = Scale.of(run.config()).global_batch, run.config().optimizer.name
    assert re.fullmatch(rf"quickstart-b{batch}-{optimizer}-[0-9a-f]{{4}}", run.run_id)
    assert run.tags() == ["one epoch", "smoke"] and run.notes() == "launched by the CLI test"


@pytest.mark.parametrize("backend", ["tensorflow", "torch", "jax"])
def test_a_dgc_run_resumes_bit_for_bit_with_every_workers_residual_and_velocity(runs, backend):
    """topk with DGC's techniques (LARS, whose momentum moves into the allreduce): each
    worker's residual and velocity are training state, saved with the checkpoint and given
    back to the same worker on resume; the sparsity warm-up resumes where it was (a backend
    whose encodings are of fixed size runs none). About 30 s a backend."""
    warmup = 2 if backends.of(backend).varying_payloads else 0
    dgc = ["compression=topk", "ratio=0.05", "dgc=true", f"sparsity_warmup_epochs={warmup}"]
    config = from_mapping(SMALL, [f"allreduce.{option}" for option in dgc])
    complete = launcher.launch(config, run_id="sparse-complete", backend=backend)
    assert wait(complete)["state"] == "completed", complete.stdout_path.read_text()[-3000:]
    run = launcher.launch(config, run_id="sparse-interrupted", backend=backend)
    stop_after_the_first_checkpoint_and_resume(run)

    a, b = read_events(complete.events_path), read_events(run.events_path)
    for phase in ("train", "eval"):
        np.testing.assert_array_equal(b[b.phase == phase].loss, a[a.phase == phase].loss)
    for name in ("optimizer.npz", "residuals.npz"):
        with (
            np.load(complete.checkpoints_path / "epoch-0003" / name) as want,
            np.load(run.checkpoints_path / "epoch-0003" / name) as got,
        ):
            assert sorted(got.files) == sorted(want.files)
            for key in want.files:
                np.testing.assert_array_equal(got[key], want[key])
    with np.load(run.checkpoints_path / "epoch-0003" / "residuals.npz") as saved:
        assert int(saved["workers"]) == 2
        state = [saved[f"rank0_{i}"] for i in range(len(saved.files) // 2)]
        kernel = [saved[f"rank{r}_0"] for r in range(2)]  # the first conv kernel's residual
    assert kernel[0].any() and not np.array_equal(kernel[0], kernel[1])  # per worker
    shapes = [a.shape for a in state[: len(state) // 2]]  # residuals, then velocities
    assert shapes == [a.shape for a in state[len(state) // 2 :]]
    assert a[a.phase == "eval"].accuracy.iloc[-1] > 0.2  # 5% of the entries: it still learns
    traffic = a[a.phase == "train"][["epoch", "comm/bytes_sent", "comm/compression_ratio"]]
    assert traffic.notna().all().all()
    # after the warm-up (resumed in its middle; without one, from the start): 5% of the
    # matrices' entries (a float32 value and an int32 index each, one bucket), the 1-D
    # variables dense, and a gradient norm per variable (LARS's trust ratios, under momentum
    # correction)
    squeezed = sum(int(np.prod(s)) for s in shapes if len(s) > 1)
    dense = sum(int(np.prod(s)) for s in shapes if len(s) <= 1)
    sent = 8 * int(np.ceil(0.05 * squeezed)) + 4 * dense + 4 * len(shapes)
    after = traffic[traffic.epoch > 2.2]
    np.testing.assert_allclose(after["comm/bytes_sent"], sent)
    np.testing.assert_allclose(after["comm/compression_ratio"], 4 * (squeezed + dense) / sent)
    early = traffic[traffic.epoch < 1.9]["comm/bytes_sent"]
    assert (early > sent).all() if warmup else (early == sent).all()  # warming up, or not


@pytest.mark.parametrize("mode", ["partial", "local_sgd"])
def test_partial_sync_and_local_sgd_train_under_horovodrun(runs, mode):
    """The averaging inside model.fit's compiled step (the simulation in test_distributed.py
    checks its arithmetic): the run completes and learns."""
    overrides = [f"sync.mode={mode}", "sync.period=4", "allreduce.fusion_threshold_mb=0.004"]
    config = from_mapping(SMALL, ["epochs=2", *overrides])
    run = launcher.launch(config, run_id=f"sync-{mode}")
    assert wait(run)["state"] == "completed", run.stdout_path.read_text()[-3000:]
    evals = read_events(run.events_path).query("phase == 'eval'")
    assert evals.epoch.tolist() == [1, 2] and evals.accuracy.iloc[-1] > 0.2
