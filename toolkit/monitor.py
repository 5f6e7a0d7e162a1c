"""Following a run from outside its processes, as the terminal, notebooks and scripts do: the
run's events file is read as it grows (:class:`~toolkit.events.EventTail`) and shown as a
``keras.utils.Progbar`` over the run's steps. Nothing here talks to a training process."""

from __future__ import annotations

import time
from collections.abc import Callable

import pandas as pd

from toolkit.events import EventTail
from toolkit.rundir import LIVE, RunDir

# (label on the bar, phase of the event, column): the newest value of each is shown.
SHOWN = (("epoch", None, "epoch"), ("loss", "train", "loss"), ("test_acc", "eval", "accuracy"))


def follow(
    run: RunDir,
    *,
    progress: bool = True,
    stop_when: Callable[[RunDir], bool] | None = None,
    poll_s: float = 0.5,
    timeout_s: float | None = None,
) -> dict:
    """Wait until ``run`` ends, or until ``stop_when(run)`` is true, and return its status.

    With ``progress``, a bar counts the run's steps up to the ``total_steps`` that training
    records in ``meta.json`` once it has its data, with the newest epoch, train loss and test
    accuracy. Raises ``TimeoutError`` if the run is still going after ``timeout_s`` seconds.
    """
    tail, bar, step = EventTail(run.events_path), None, 0
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        status = run.status()
        new = tail.read_new()
        if progress and bar is None:
            bar = _progress_bar(run)
        if bar is not None and "step" in new and new["step"].notna().any():
            step = min(int(new["step"].max()), bar.target)
            bar.update(step, values=latest_values(new))
        if status["state"] not in LIVE or (stop_when is not None and stop_when(run)):
            if bar is not None and step < bar.target:  # end the bar; full if it completed
                bar.update(bar.target if status["state"] == "completed" else step, finalize=True)
            return status
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{run.run_id} still {status['state']} after {timeout_s} s")
        time.sleep(poll_s)


def latest_values(events: pd.DataFrame) -> list[tuple[str, float]]:
    """``(label, value)`` of the newest epoch, train loss and test accuracy in ``events``,
    for those it has."""
    values = []
    for label, phase, column in SHOWN:
        if column not in events or (phase is not None and "phase" not in events):
            continue
        rows = events if phase is None else events[events["phase"] == phase]
        found = rows[column].dropna()
        if len(found):
            values.append((label, float(found.iloc[-1])))
    return values


def _progress_bar(run: RunDir):
    """A bar over the run's steps, or ``None`` while training has not said how many."""
    total = run.meta().get("total_steps")
    if not total:
        return None
    import keras

    return keras.utils.Progbar(
        total, stateful_metrics=[label for label, *_ in SHOWN], unit_name="step"
    )
