"""``toolkit.monitor.follow``: a run followed from outside through its run directory, with a
progress bar fed by the events a (here simulated) training process appends."""

from __future__ import annotations

import os
import threading
import time

import pandas as pd
import pytest

from toolkit.events import EventWriter
from toolkit.monitor import follow, latest_values
from toolkit.rundir import RunDir

TOTAL = 60


def live_run(tmp_path, total_steps: int | None = TOTAL) -> RunDir:
    run = RunDir.create(tmp_path, "live")
    run.set_status("running", pid=os.getpid())  # this process stands in for training
    if total_steps:
        run.update_meta(total_steps=total_steps)
    return run


def train(run: RunDir, last_step: int, final_state: str | None, every: float = 0.01) -> None:
    """Append a train event per 10 steps (an eval event per 20) up to ``last_step``, then
    record ``final_state``."""
    with EventWriter(run.events_path) as writer:
        for step in range(10, last_step + 1, 10):
            epoch = step / 20
            writer.write({"step": step, "epoch": epoch, "phase": "train", "loss": 1 / step})
            if step % 20 == 0:
                writer.write(
                    {"step": step, "epoch": epoch, "phase": "eval", "accuracy": step / 100}
                )
            time.sleep(every)
    if final_state:
        run.set_status(final_state)


def in_background(*args, **kwargs) -> threading.Thread:
    thread = threading.Thread(target=train, args=args, kwargs=kwargs, daemon=True)
    thread.start()
    return thread


def test_follow_counts_to_the_total_and_returns_the_final_status(tmp_path, capsys):
    run = live_run(tmp_path)
    writer = in_background(run, TOTAL, "completed")
    status = follow(run, poll_s=0.02, timeout_s=30)
    writer.join()
    assert status["state"] == "completed"
    bar = capsys.readouterr().out.replace("\b", "").split("\r")[-1]
    assert f"{TOTAL}/{TOTAL}" in bar
    assert "epoch: 3.0000" in bar and "test_acc: 0.6000" in bar
    assert bar.endswith("\n")


def test_follow_stops_when_asked_and_ends_the_bar_where_the_run_is(tmp_path, capsys):
    run = live_run(tmp_path)
    in_background(run, 30, None).join()  # steps 10..30 written, the run still going
    status = follow(run, stop_when=lambda r: True, poll_s=0.02, timeout_s=30)
    assert status["state"] == "running"
    bar = capsys.readouterr().out.replace("\b", "").split("\r")[-1]
    assert f"30/{TOTAL}" in bar and bar.endswith("\n")


def test_a_failed_run_ends_the_wait_and_a_stuck_one_times_out(tmp_path):
    run = live_run(tmp_path)
    in_background(run, 20, "failed")
    assert follow(run, progress=False, poll_s=0.02, timeout_s=30)["state"] == "failed"
    stuck = live_run(tmp_path / "other")
    with pytest.raises(TimeoutError, match="live still running"):
        follow(stuck, poll_s=0.02, timeout_s=0.2)


def test_no_bar_until_training_says_how_many_steps(tmp_path, capsys):
    run = live_run(tmp_path, total_steps=None)
    in_background(run, 20, "completed")
    assert follow(run, poll_s=0.02, timeout_s=30)["state"] == "completed"
    assert capsys.readouterr().out == ""


def test_latest_values_take_each_from_its_phase():
    events = pd.DataFrame(
        [
            {"step": 10, "epoch": 0.5, "phase": "train", "loss": 2.0},
            {"step": 20, "epoch": 1.0, "phase": "eval", "loss": 9.0, "accuracy": 0.4},
            {"step": 30, "epoch": 1.5, "phase": "train", "loss": 1.5},
            {"step": 30, "epoch": 1.5, "phase": "trust_ratio"},
        ]
    )
    assert latest_values(events) == [("epoch", 1.5), ("loss", 1.5), ("test_acc", 0.4)]
    assert latest_values(events[events.phase == "train"]) == [("epoch", 1.5), ("loss", 1.5)]
    assert latest_values(pd.DataFrame({"epoch": [2.0], "loss": [1.0]})) == [("epoch", 2.0)]
    assert latest_values(pd.DataFrame()) == []
