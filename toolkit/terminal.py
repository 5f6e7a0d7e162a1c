"""What the CLI shows as text: the runs table, one run in full, the launch queue, and cells."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import pandas as pd

from toolkit import host_list
from toolkit.launching import launch as launcher
from toolkit.launching import slots
from toolkit.runs import checkpoints
from toolkit.runs.rundir import RunDir, list_runs, runs_root
from toolkit.runs.table import matches, outcome_text, progress_text, reason_now, summary
from toolkit.words import counted

TABLE_COLUMNS = [
    "run_id",
    "state",
    "progress",
    "best_eval_accuracy",
    "samples_per_sec",
    "optimizer",
    "global_batch",
    "workers",
    "where",
    "started (UTC)",
    "duration_s",
    "last_step",
    "last_loss",
    "best_eval_loss",
    "last_eval_accuracy",
    "tags",
    "reason",
]
REASON_WIDTH = 48
"""How much of a reason the runs table shows (``show RUN`` gives the whole of it)."""


def runs_table(
    root: str | None = None,
    probes: bool = False,
    tags: Sequence[str] = (),
    search: str | None = None,
) -> str:
    """The runs as a terminal table: progress as ``epoch x of N``, start time in UTC to the
    minute, durations in whole seconds, measurements to four significant digits, ``-`` where a
    run has no value yet, and why a run ended as it did (or is silent) cut to
    :data:`REASON_WIDTH` characters (an end only a reader could tell is recorded first:
    :func:`toolkit.launching.launch.settle`). A run whose newest checkpoint is damaged gets a
    line under the table. Probe runs are left out unless ``probes``, as on the Runs page, and a
    last line says how many were; ``tags`` keeps the runs that carry all of them, ``search``
    those whose id, tags or notes contain it."""
    listed = list_runs(root)
    for run in listed:  # an end only a reader could tell, recorded before it is shown
        launcher.settle(run)
    every = [summary(run) for run in listed]
    rows = [row for row in every if probes or not row["probe"]]
    hidden = len(every) - len(rows)
    note = f"\n({hidden} probe run{'s' * (hidden != 1)} not shown: runs --all)" if hidden else ""
    rows = [row for row in rows if set(tags) <= set(row["tags"]) and matches(row, search)]
    if not rows:
        return f"no runs under {runs_root(root).resolve()}" + note
    table = pd.DataFrame(rows)
    table["progress"] = [progress_text(row) for row in rows]
    table["tags"] = table["tags"].map(", ".join)
    started = pd.to_datetime(pd.to_numeric(table["started"]), unit="s")
    table["started (UTC)"] = started.dt.strftime("%Y-%m-%d %H:%M")
    table["duration_s"] = pd.to_numeric(table["duration_s"]).round()
    now = time.time()
    table["reason"] = [shortened(reason_now(row, now)) for row in rows]
    damaged = "".join(
        f"\n{row['run_id']}: {row['damaged_checkpoint']}"
        for row in rows
        if row["damaged_checkpoint"]
    )
    return table[TABLE_COLUMNS].map(cell).to_string(index=False) + damaged + note


def cell(value) -> str:
    """A table cell: ``-`` for no value, a float to four significant digits (whole above
    1,000)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.0f}" if value.is_integer() or abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def run_text(run: RunDir) -> str:
    """``show RUN``: one run in full, a line each: its state and why (a damaged newest
    checkpoint among the reasons), where it ran, its progress and results, its last event's
    age, what its latest resume started from, its tags, notes and folder."""
    launcher.settle(run)
    row, status, now = summary(run), run.recorded_status(), time.time()
    lines = [f"{run.run_id}: {row['state']}"]
    if why := reason_now(row, now):
        lines.append(f"  reason: {why}")
    lines.append(f"  where: {row['where']}; {counted(row['workers'] or 0, 'worker')}")
    if progress := progress_text(row):
        lines.append(f"  progress: {progress} · {outcome_text(row)}")
    if row["last_heard"]:
        lines.append(f"  last heard from: {now - row['last_heard']:.0f} s ago")
    if resumed := checkpoints.resumed_text(status):
        lines.append(f"  resumed {resumed}")
    if row["tags"]:
        lines.append(f"  tags: {', '.join(row['tags'])}")
    if row["notes"]:
        lines.append(f"  notes: {row['notes']}")
    lines.append(f"  folder: {run.path.resolve()}")
    return "\n".join(lines)


def frame_text(table: pd.DataFrame) -> str:
    """A sweep's or a search's table as text: its cells as :func:`cell` writes them, its
    ``reason`` column last and :func:`shortened`."""
    if "reason" in table:
        table = table.drop(columns=["reason"]).assign(reason=table["reason"].map(shortened))
    return table.map(cell).to_string(index=False)


def shortened(text, width: int = REASON_WIDTH):
    """``text`` cut to ``width`` characters, ``…`` ending one that was cut; ``None`` stays."""
    if not isinstance(text, str) or len(text) <= width:
        return text
    return text[: width - 1].rstrip() + "…"


def queue_text(root: str | None, capacity: str | None) -> str:
    """The launch queue: its capacity (set first to ``capacity``, or back to the default with
    ``default``) and each run holding or waiting for slots."""
    if capacity:
        slots.set_capacity(None if capacity == "default" else capacity, root)
    have = host_list.join(slots.capacity(root)).replace(",", ", ")
    lines = [f"capacity: {have}"]
    for entry in slots.entries(root):
        where = host_list.join(entry["slots"])
        place = "holding" if entry["position"] is None else f"waiting #{entry['position']}"
        lines.append(f"  {entry['run_id']}  {where}  {place}")
    return "\n".join(lines if len(lines) > 1 else [*lines, "  (empty)"])
