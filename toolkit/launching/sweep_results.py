"""A sweep's results (:mod:`toolkit.launching.sweep`), read back from its cells' run
directories: :func:`results` one row per cell, :func:`aggregate` the mean and spread over
seeds, :func:`figure` any metric against any axis.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from toolkit.launching.sweep import METHOD, SEED, Cell, Sweep
from toolkit.plan import Scale
from toolkit.runs.curves import updates_by_epoch, wide
from toolkit.runs.events import diverged, read_events
from toolkit.runs.rundir import LIVE, RunDir, list_runs
from toolkit.runs.states import State
from toolkit.runs.table import summary

METRICS = (
    "final_test_accuracy",
    "best_test_accuracy",
    "final_test_loss",
    "final_train_loss",
    "updates",
    "wall_s",
    "samples_per_sec",
)


def cell_runs(sweep: Sweep | str, root: str | Path | None = None) -> dict[str, RunDir]:
    """``{cell key: its latest run}`` for the runs labelled with this sweep's name."""
    name = sweep if isinstance(sweep, str) else sweep.name
    found: dict[str, RunDir] = {}
    for run in reversed(list_runs(root)):  # oldest first: a later attempt replaces an earlier
        meta = run.meta()
        if meta.get("sweep") == name and isinstance(meta.get("cell"), str):
            found[meta["cell"]] = run
    return found


def results(sweep: Sweep, root: str | Path | None = None, events=None) -> pd.DataFrame:
    """One row per cell, in the sweep's order: coordinates, ``run_id``, ``state``, ``diverged``
    (a train event logged a NaN or infinite loss: training logs the step that diverged before
    it stops), the :data:`METRICS` (final ones only for a completed
    run; ``updates``: optimizer updates taken) and ``global_batch``. ``events(run)`` reads a
    run's events (default :func:`toolkit.runs.events.read_events`; the app passes its cache)."""
    runs = cell_runs(sweep, root)
    rows = []
    for cell in sweep.cells:
        run_dir = runs.get(cell.key)
        row = {**cell.coordinates, "run_id": run_dir.run_id if run_dir else None}
        rows.append(row | _measure(cell, run_dir, events))
    return pd.DataFrame(rows)


def _measure(cell: Cell, run_dir: RunDir | None, events) -> dict[str, Any]:
    if run_dir is None:
        return {
            "state": "pending",
            "diverged": False,
            **dict.fromkeys(METRICS, math.nan),
            "global_batch": Scale.of(cell.config).global_batch,
            "reason": None,
        }
    history = (events or _read_events)(run_dir)
    row = summary(run_dir, history)
    completed = row["state"] == State.COMPLETED
    evals = history[history["phase"] == "eval"] if "phase" in history else history.iloc[0:0]
    losses = evals["loss"].dropna() if "loss" in evals else evals.iloc[0:0]
    steps = run_dir.meta().get("total_steps")
    scale = Scale.of(cell.config)
    updates = steps // scale.steps_per_update if steps else None
    if cell.config.lr_scaling.rule == "adascale" and completed:  # total_steps counts its clock
        updates = _adascale_updates(cell.config, history, evals)
    return {
        "state": row["state"],
        "diverged": diverged(history),
        "final_test_accuracy": row["last_eval_accuracy"] if completed else math.nan,
        "best_test_accuracy": row["best_eval_accuracy"],
        "final_test_loss": float(losses.iloc[-1]) if completed and len(losses) else math.nan,
        "final_train_loss": row["last_loss"] if completed else math.nan,
        "updates": updates,
        "wall_s": row["duration_s"],
        "samples_per_sec": row["samples_per_sec"],
        "global_batch": scale.global_batch,
        "reason": row.get("reason"),
    }


def _adascale_updates(config, history: pd.DataFrame, evals: pd.DataFrame) -> int:
    """The updates an AdaScale run took (an outcome): its steps over its steps per update;
    for an adaptive batch, epoch by epoch, at the batch each eval event says its epoch had."""
    scale = Scale.of(config)
    if "global_batch" not in evals:
        return int(history["step"].max()) // scale.steps_per_update
    return round(updates_by_epoch(evals, scale.examples_per_step).iloc[-1])


def _read_events(run_dir: RunDir) -> pd.DataFrame:
    try:
        return read_events(run_dir.events_path)
    except OSError:
        return pd.DataFrame()


def aggregate(
    table: pd.DataFrame, metrics: tuple[str, ...] = METRICS, by: list[str] | None = None
) -> pd.DataFrame:
    """Mean, standard deviation and count over seeds of each metric, per combination of ``by``
    (default: every coordinate but ``seed``), with the number of cells that ``failed`` (failed
    or stopped), ``diverged`` or are not ended yet (``pending``: pending, queued or running).
    A metric's mean and std are over the completed cells only."""
    by = axes_of(table) if by is None else by
    rows = []
    for values, group in table.groupby(by, sort=False, dropna=False) if by else [((), table)]:
        ok = group[group["state"] == State.COMPLETED]
        row = dict(zip(by, values if isinstance(values, tuple) else (values,), strict=True))
        row |= {
            "cells": len(group),
            "completed": len(ok),
            "failed": int(
                group["state"].isin([State.FAILED, State.STOPPED, State.UNREADABLE]).sum()
            ),
            "diverged": int(group["diverged"].sum()),
            "pending": int(group["state"].isin(["pending", *LIVE]).sum()),
        }
        for metric in metrics:
            series = pd.to_numeric(ok[metric], errors="coerce").dropna() if metric in ok else ()
            row[f"{metric}_mean"] = series.mean() if len(series) else math.nan
            row[f"{metric}_std"] = series.std(ddof=1) if len(series) > 1 else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def axes_of(table: pd.DataFrame) -> list[str]:
    """The coordinate columns of a :func:`results` table, but ``seed``."""
    return [c for c in table.columns if c not in _ROW_COLUMNS and c != SEED]


_ROW_COLUMNS = {"run_id", "state", "diverged", "reason", "global_batch", *METRICS}


def figure(
    table: pd.DataFrame,
    metric: str = "final_test_accuracy",
    x: str = "batch.global_size",
    color: str | None = METHOD,
    title: str | None = None,
):
    """Plotly figure of ``metric`` (mean ± std over seeds) against the column ``x``, one line
    per combination of the other axes (``color`` first in the legend, so one line per method
    when it is the only other axis); a log x-axis for numbers spanning a factor of 8 or more."""
    import plotly.graph_objects as go

    from toolkit.runs import theme

    axes = [a for a in axes_of(table) if a != x]
    lines = sorted(axes, key=lambda a: a != color)
    means = aggregate(table, (metric,), by=[*lines, x])
    fig = go.Figure()
    groups = means.groupby(lines, sort=False, dropna=False) if lines else [("all", means)]
    for name, part in groups:
        part = part.sort_values(x)
        fig.add_trace(
            go.Scatter(
                x=part[x],
                y=part[f"{metric}_mean"],
                error_y={"type": "data", "array": part[f"{metric}_std"].fillna(0)},
                mode="lines+markers",
                name=", ".join(map(str, name)) if isinstance(name, tuple) else str(name),
            )
        )
    fig.update_layout(
        title=title or f"{metric} against {x} (mean ± std over seeds)",
        xaxis={"title": x, "type": "log" if wide(means[x]) else None},
        yaxis={"title": metric},
        legend={"title": ", ".join(lines)},
        template=theme.NAME,
    )
    return fig
