"""``toolkit.runs.monitor``: a run followed from outside through its run directory, fed by the
events a (here simulated) training process appends: the terminal's progress bar (``follow``) and the
notebook's live figure (``LiveView``, built and updated here without a kernel;
tests/test_notebooks.py shows it in one and tests/test_jupyter.py draws it in a browser)."""

from __future__ import annotations

import os
import sys
import threading
import time

import pandas as pd
import pytest

from toolkit.runs.events import EventWriter, truncate_after
from toolkit.runs.monitor import LiveView, follow, in_notebook, latest_values, live, watch
from toolkit.runs.rundir import RunDir

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


def test_follow_counts_to_the_total_and_returns_the_final_status(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)  # a terminal: Keras's bar
    run = live_run(tmp_path)
    writer = in_background(run, TOTAL, "completed")
    status = follow(run, poll_s=0.02, timeout_s=30)
    writer.join()
    assert status["state"] == "completed"
    bar = capsys.readouterr().out.replace("\b", "").split("\r")[-1]
    assert f"{TOTAL}/{TOTAL}" in bar
    assert "epoch: 3.0000" in bar and "test_acc: 0.6000" in bar
    assert bar.endswith("\n")


def test_follow_off_a_terminal_prints_a_plain_line_per_epoch(tmp_path, capsys):
    """A pipe or a log file gets no ANSI codes and no \\r frames: a line at each eval event,
    with the values as they were then, and one more where the run ended between epochs."""
    run = live_run(tmp_path, total_steps=70)
    writer = in_background(run, 70, "completed", every=0.002)
    follow(run, poll_s=0.05, timeout_s=30)
    writer.join()
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"step {s}/70 - epoch: {s / 20:g} - loss: {1 / s:.4g} - test_acc: {s / 100:.4g}"
        for s in (20, 40, 60)
    ] + ["step 70/70 - epoch: 3.5 - loss: 0.01429 - test_acc: 0.6"]


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


def test_no_bar_until_training_says_how_many_steps(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
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


def drawn(view: LiveView, panel: str) -> dict[str, tuple[list, list]]:
    """``curve name -> (x, y)`` of one panel of the view."""
    at = view.panels.index(panel)
    axis = "x" if at == 0 else f"x{at + 1}"  # Plotly's name of the panel's axis
    return {t.name: (list(t.x), list(t.y)) for t in view.figure.data if t.xaxis == axis}


def test_live_view_grows_with_the_file_and_stops_when_the_run_ends(tmp_path):
    run = live_run(tmp_path)
    view = LiveView(run)
    seen = []  # train-loss points drawn after each refresh
    refresh = view.refresh

    def counting(status=None, **kwargs):
        refresh(status, **kwargs)
        seen.append(len(view.curve("loss", "train")[0]) if "loss" in view.panels else 0)

    view.refresh = counting
    writer = in_background(run, TOTAL, "completed", every=0.05)
    status = watch(run, view, poll_s=0.02, timeout_s=30)
    assert not writer.is_alive(), "the watch ended before the run did"
    assert status["state"] == "completed"
    assert seen == sorted(seen) and len(set(seen)) >= 3, seen  # grew, in several steps
    steps = list(range(10, TOTAL + 1, 10))
    assert drawn(view, "loss") == {"train": (steps, [1 / s for s in steps])}
    evals = steps[1::2]
    assert drawn(view, "accuracy") == {"eval": (evals, [s / 100 for s in evals])}
    assert "completed" in view.line and f"step {TOTAL} / {TOTAL}" in view.line
    assert view.done == 1.0 and view.outcome == "success"


def test_live_view_redraws_a_rewound_file_and_names_a_failure(tmp_path):
    run = live_run(tmp_path)
    in_background(run, 40, None).join()
    view = LiveView(run)
    view.refresh()
    assert drawn(view, "loss")["train"][0] == [10, 20, 30, 40]
    truncate_after(run.events_path, 20)  # what a resume does
    in_background(run, 20, None).join()  # ...then the run writes on (here: steps 10, 20 again)
    run.set_status("failed", reason="NonFiniteLoss: loss is nan at step 21")
    view.refresh()
    assert drawn(view, "loss")["train"][0] == [10, 20, 10, 20]
    assert "failed" in view.line and "loss is nan at step 21" in view.line
    assert view.outcome == "danger"


def test_live_outside_a_notebook_is_the_terminal_progress_bar(tmp_path, capsys):
    assert not in_notebook()
    run = live_run(tmp_path)
    in_background(run, TOTAL, "completed").join()
    assert live(run, poll_s=0.02, timeout_s=30)["state"] == "completed"
    assert f"{TOTAL}/{TOTAL}" in capsys.readouterr().out.replace("\b", "").split("\r")[-1]
