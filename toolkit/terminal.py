"""What the CLI shows as text: the runs table, the launch queue, and a table's cells."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from toolkit import host_list
from toolkit.launching import launch as launcher
from toolkit.launching import slots
from toolkit.runs.rundir import list_runs
from toolkit.runs.table import matches, progress_text, summary

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
]


def runs_table(
    root: str | None = None,
    probes: bool = False,
    tags: Sequence[str] = (),
    search: str | None = None,
) -> str:
    """The runs as a terminal table: progress as ``epoch x of N``, start time in UTC to the
    minute, durations in whole seconds, measurements to four significant digits, ``-`` where a
    run has no value yet (a failed run's reason is left to the dashboard and ``status.json``,
    where an end only a reader could tell is recorded first:
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
        return "no runs" + note
    table = pd.DataFrame(rows)
    table["progress"] = [progress_text(row) for row in rows]
    table["tags"] = table["tags"].map(", ".join)
    started = pd.to_datetime(pd.to_numeric(table["started"]), unit="s")
    table["started (UTC)"] = started.dt.strftime("%Y-%m-%d %H:%M")
    table["duration_s"] = pd.to_numeric(table["duration_s"]).round()
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
