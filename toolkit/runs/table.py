"""The runs table: one row per run (:func:`summary`), how a row reads (:func:`progress_text`,
:func:`outcome_text`), whether a running run went silent (:func:`silence`, told with its
reason by :func:`reason_now`) and whether it matches a search (:func:`matches`). The CLI's
``runs`` and ``show``, the Runs page, sweeps' results and notebooks all read rows from here;
like every reader, it never writes a run's files, and a row never raises on a broken one.
"""

from __future__ import annotations

import time
from typing import Any

import pandas as pd

from toolkit import backends
from toolkit.config import LOST_WORKER_AFTER_S, ConfigError
from toolkit.plan import Scale
from toolkit.runs import checkpoints, placement
from toolkit.runs.events import read_events
from toolkit.runs.rundir import LIVE, RunDir, short_error
from toolkit.runs.states import State

STALL_FACTOR = 10
"""A running run is silent once its last event is older than this many of its usual gaps (the
median gap between its latest :data:`STALL_GAPS` train events), than twice its longest pause
since it last started (an evaluation, a checkpoint), and than a third of its
``lost_worker_after_s``: so it is said before that timeout fails the run."""
STALL_GAPS = 20


def silence(row: dict[str, Any], now: float) -> str | None:
    """What to say of a :func:`summary` row's running run whose events stopped (a worker
    stopped or stuck, a host unreachable): ``no event for 44 s (one every 0.8 s before)``
    once its last event is older than its ``silent_after_s`` (:data:`STALL_FACTOR`); ``None``
    while they come as usual, before two train events, or for a run not running. ``now`` is a
    parameter so that a cached row stays right."""
    after, last = row.get("silent_after_s"), row.get("last_heard")
    if row.get("state") != State.RUNNING or after is None or not last or now - last <= after:
        return None
    return (
        f"no event for {now - last:.0f} s (one every {row['event_gap_s']:.2g} s before): "
        "a worker may be stuck"
    )


def _silent_after(events: pd.DataFrame, since: float, lost_worker_after_s: float) -> tuple:
    """A run's usual gap between train events and the age at which its silence is told
    (:data:`STALL_FACTOR`), from ``events`` (those after ``since`` for its longest pause);
    ``(None, None)`` before two train events."""
    if "wall" not in events or "phase" not in events:
        return None, None
    walls = events["wall"].dropna()
    train = events.loc[events["phase"] == "train", "wall"].dropna().tail(STALL_GAPS + 1)
    if len(train) < 2:
        return None, None
    gap = float(train.diff().median())
    longest = walls[walls >= since].diff().max()  # NaN with fewer than two
    longest = float(longest) if pd.notna(longest) else 0.0
    return gap, max(STALL_FACTOR * gap, 2 * longest, lost_worker_after_s / 3)


def reason_now(row: dict[str, Any], now: float) -> str | None:
    """A :func:`summary` row's reason, with what its :func:`silence` says at ``now``."""
    said = [text for text in (row["reason"], silence(row, now)) if text]
    return "; ".join(said) or None


def matches(row: dict[str, Any], text: str | None) -> bool:
    """Whether a :func:`summary` row's id, tags or notes contain ``text`` (any case; no text:
    every row)."""
    if not text:
        return True
    haystack = "\n".join([row["run_id"], *row.get("tags", []), row.get("notes", "")])
    return text.casefold() in haystack.casefold()


def progress_text(row: dict[str, Any]) -> str | None:
    """A :func:`summary` row's progress as ``<epoch> of <epochs>`` (``None`` without a config),
    ``... rounds`` where its epochs are not passes over the data (``steps_per_epoch`` cuts them:
    a calibration's or a probe's evaluation rounds); an AdaScale run's as its epochs so far and
    how far its clock ``τ`` is."""
    if not row["epochs"]:
        return None
    if row.get("adascale"):  # its epochs are an outcome; its progress is its clock's
        return f"{round(row['epoch'], 2):g} epochs, τ {row['progress'] or 0:.0%}"
    epoch = row["epochs"] if row["state"] == State.COMPLETED else row["epoch"]
    return f"{round(epoch, 2):g} of {row['epochs']}" + " rounds" * bool(row.get("rounds"))


def outcome_text(row: dict[str, Any]) -> str:
    """How a :func:`summary` row's run went, in one line: how long it trained, its final (for
    a run that did not complete: last) and best test accuracy, and its throughput (``no
    results yet`` before any)."""
    parts = []
    if row["duration_s"] is not None:
        minutes, seconds = divmod(round(row["duration_s"]), 60)
        parts.append(f"duration {minutes}m {seconds:02d}s" if minutes else f"{seconds}s")
    if row["last_eval_accuracy"] is not None:
        last = "final" if row["state"] == State.COMPLETED else "last"
        parts.append(
            f"{last} accuracy {row['last_eval_accuracy']:.4f} "
            f"(best {row['best_eval_accuracy']:.4f})"
        )
    if row["samples_per_sec"] is not None:
        parts.append(f"{row['samples_per_sec']:,.0f} samples/s")
    return " · ".join(parts) or "no results yet"


def summary(run: RunDir, events: pd.DataFrame | None = None) -> dict[str, Any]:
    """One row of the runs table: identity, state, set-up, and the headline numbers
    (``events``: the run's events if the caller has already read them). Never raises: what
    cannot be read is left empty and named in ``reason`` as ``unreadable: ...``. An ended
    run's newest checkpoint, truncated or missing a file, is ``damaged_checkpoint`` and told in
    ``reason`` too (:func:`~toolkit.runs.checkpoints.damaged_latest`, by the files' sizes)."""
    status, meta = run.status(), run.meta()
    problems = []
    row = {
        "run_id": run.run_id,
        "state": status.get("state"),
        "where": placement.where(status),
        "optimizer": None,
        "global_batch": meta.get("global_batch"),
        "workers": meta.get("world_size"),
        "backend": backends.recorded(meta),
        "epochs": None,
        "rounds": False,
        "adascale": False,
    }
    lost_after = LOST_WORKER_AFTER_S  # the config's, once read
    try:
        config = run.config()
        lost_after = config.lost_worker_after_s
        row.update(
            optimizer=config.optimizer.name,
            # an elastic run's: as many as it has now (or had last)
            workers=(config.elastic and status.get("world_size")) or config.workers,
            global_batch=Scale.of(config).global_batch,
            epochs=config.epochs,
            rounds=config.steps_per_epoch is not None,
            adascale=config.lr_scaling.rule == "adascale",
        )
    except FileNotFoundError:
        problems.append("no config.yaml")
    except (OSError, ConfigError) as error:
        problems.append(f"config.yaml: {short_error(error)}")
    if events is None:
        try:
            events = read_events(run.events_path)
        except OSError as error:
            problems.append(short_error(error))
            events = pd.DataFrame()
    train = events[events["phase"] == "train"] if "phase" in events else events.iloc[0:0]
    evals = events[events["phase"] == "eval"] if "phase" in events else events.iloc[0:0]
    started = status.get("started") or meta.get("created")
    ended = status.get("state") not in LIVE
    finished = status.get("finished") or (status.get("updated") if ended else time.time())

    def column(frame, name, how):
        if name not in frame or frame[name].dropna().empty:
            return None
        values = frame[name].dropna()
        return float(getattr(values, how)() if how != "last" else values.iloc[-1])

    epoch = column(train, "epoch", "last") or 0.0
    if status.get("state") == State.COMPLETED and row["epochs"] and not row["adascale"]:
        epoch = float(row["epochs"])  # all of them, not where its last train event fell
    tau, total = column(train, "tau", "last"), meta.get("total_steps")
    if status.get("state") == State.COMPLETED:
        progress = 1.0
    elif row["adascale"]:  # on AdaScale's clock: base-run updates done
        progress = min(1.0, tau / total) if tau is not None and total else 0.0
    else:
        progress = min(1.0, epoch / row["epochs"]) if row["epochs"] else None
    reasons = [status.get("reason")] if status.get("reason") else []
    gap, silent_after = _silent_after(events, status.get("updated") or 0.0, lost_after)
    if problems and status.get("state") != State.QUEUED:
        reasons.append("unreadable: " + "; ".join(problems))
    # an ended run's, by the files' sizes (a stat each): what a resume would meet
    damaged = None if not ended else checkpoints.damaged_latest(run.checkpoints_path, False)
    reasons += [damaged] if damaged else []
    return {
        **row,
        "epoch": epoch if row["epochs"] else None,
        "progress": progress,
        "started": started,
        # the time it trained: less the time it lay stopped before a resume
        "duration_s": finished - started - status.get("paused_s", 0.0)
        if started and finished
        else None,
        "last_step": column(train, "step", "last"),
        "last_loss": column(train, "loss", "last"),
        "best_eval_loss": column(evals, "loss", "min"),
        "last_eval_accuracy": column(evals, "accuracy", "last"),
        "best_eval_accuracy": column(evals, "accuracy", "max"),
        "samples_per_sec": column(train, "samples_per_sec", "median"),
        # the later of its last event and its last change of state (a resume starting again)
        "last_heard": max(column(events, "wall", "max") or 0.0, status.get("updated") or 0.0),
        "event_gap_s": gap,
        "silent_after_s": silent_after,
        "reason": "; ".join(reasons) or None,
        "damaged_checkpoint": damaged,
        "probe": bool(meta.get("probe", False)),
        "tags": meta.get("tags", []),
        "notes": meta.get("notes", ""),
    }
