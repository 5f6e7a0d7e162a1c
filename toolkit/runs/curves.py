"""What a run's events draw as, for every view of a run (the dashboard, a notebook's live view).

A run's ``events.jsonl`` holds rows of several phases (``train``, ``eval``, ``gns``,
``trust_ratio``) with whatever numeric columns the run logs. :func:`panels` turns them into
charts by one rule, so a metric nobody planned for is drawn too:

- every numeric column of the ``train`` and ``eval`` phases is a panel named after it, with one
  curve per phase; eval's ``train_<m>`` (the epoch's mean) joins panel ``<m>`` as
  ``train (epoch)``;
- a column ``<group>/<name>`` (in any phase: per-layer ``trust_ratio/<layer>``) is curve
  ``<name>`` of panel ``<group>``;
- of the gradient-noise-scale diagnostics, ``b_simple`` is drawn (the others feed it);
- panels come in :data:`FIRST` order, then alphabetically.

Long curves are thinned for drawing by :func:`downsample`; :func:`bytes_axis` puts every event
on the axis of traffic, for accuracy against bytes sent; :func:`spread` makes a group of runs'
curves one mean with its min-max band.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

MAX_POINTS = 2000
"""Points drawn per curve at most; longer curves are downsampled (min/max per bucket)."""

FIRST = ("loss", "accuracy", "lr", "samples_per_sec", "b_simple")
"""Panels shown first, in this order."""

TITLES = {
    "lr": "learning rate",
    "samples_per_sec": "samples/sec",
    "b_simple": "gradient noise scale B_simple",
    "trust_ratio": "trust ratio per layer",
    "cpu_percent": "CPU per worker (%, 100 = one core)",
    "memory_gb": "memory per worker (GB)",
    "host_memory_percent": "host memory in use (%)",
    "gpu_memory_gb": "GPU memory per worker (GB)",
    "bytes_sent_per_update": "bytes each worker sent per update",
}
"""How a panel is titled, where its column name says it poorly."""

AXES = ("step", "epoch", "wall", "phase")
"""Columns that place a row rather than measure something."""

EXACT = frozenset({"lr", "world_size", "global_batch", "tau"})
"""Columns the run sets rather than measures (its schedule, its workers, its batch, AdaScale's
clock): drawn as they are, never smoothed, since a smoothed learning rate lags its own schedule
and a smoothed worker count shows workers that never were."""

PHASE_COLUMNS = {"train": None, "eval": None, "gns": ("b_simple",)}
"""The phases whose plain columns are drawn (``None``: all of them), and which."""


@dataclass(frozen=True)
class Curve:
    """One curve of a panel: the rows of ``phase``, column ``column``, shown as ``name``."""

    phase: str
    column: str
    name: str


def panels(events: pd.DataFrame) -> dict[str, list[Curve]]:
    """The panels ``events`` draws as, ``title -> curves``, by the rule in the module doc.
    Only columns with at least one number in their phase count."""
    found: dict[str, list[Curve]] = {}
    if "phase" not in events:
        return found
    for phase, rows in events.groupby("phase", sort=False):
        for column in rows.columns:
            if column in AXES or not _has_numbers(rows[column]):
                continue
            group, slash, name = column.partition("/")
            if slash:
                title, curve = group, Curve(phase, column, name)
            elif phase not in PHASE_COLUMNS or (
                PHASE_COLUMNS[phase] is not None and column not in PHASE_COLUMNS[phase]
            ):
                continue
            elif phase == "eval" and column.startswith("train_"):
                title, curve = column.removeprefix("train_"), Curve(phase, column, "train (epoch)")
            else:
                title, curve = column, Curve(phase, column, phase)
            found.setdefault(title, []).append(curve)
    order = {title: i for i, title in enumerate(FIRST)}
    return {
        title: sorted(found[title], key=_curve_order)
        for title in sorted(found, key=lambda t: (order.get(t, len(order)), t))
    }


def _curve_order(curve: Curve) -> tuple:
    return (
        ("train", "eval").index(curve.phase) if curve.phase in ("train", "eval") else 2,
        curve.name,
    )


def _has_numbers(column: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(column) and column.notna().any()


def downsample(y: np.ndarray, max_points: int = MAX_POINTS) -> np.ndarray:
    """Indices that keep at most ``max_points`` of ``y`` (sorted): the first and last point,
    and in each of ``max_points // 3`` buckets its min and max (so spikes survive) and its
    first non-finite value (so a diverged loss stays visible as the gap where it broke)."""
    n = len(y)
    if n <= max_points:
        return np.arange(n)
    size = int(np.ceil(n / max(1, (max_points - 2) // 3)))
    padded = np.full(size * int(np.ceil(n / size)), np.nan)
    padded[:n] = y
    rows = padded.reshape(-1, size)
    finite = np.isfinite(rows)
    low = np.where(finite, rows, np.inf).argmin(axis=1)
    high = np.where(finite, rows, -np.inf).argmax(axis=1)
    offsets = np.arange(len(rows)) * size
    broken = np.flatnonzero((~finite).any(axis=1))
    keep = [
        [0, n - 1],
        offsets + low,
        offsets + high,
        offsets[broken] + (~finite[broken]).argmax(1),
    ]
    keep = np.concatenate(keep)
    return np.unique(keep[keep < n])


def wide(values) -> bool:
    """Whether an axis of ``values`` reads better on a log scale: all positive numbers,
    spanning a factor of 8 or more (a batch of 32 to 4,096; a rate of 0.01 to 1)."""
    numbers = pd.to_numeric(pd.Series(values), errors="coerce")
    return bool(numbers.notna().all() and numbers.min() > 0 and numbers.max() / numbers.min() >= 8)


def spread(curves: list[tuple[np.ndarray, np.ndarray]]) -> pd.DataFrame:
    """Several runs' curves of one metric as one: at every x any of them has, their mean, min
    and max (columns ``x``, ``mean``, ``low``, ``high``, by x). Each curve counts between its
    own first and last x, linearly interpolated between its points, and not outside them: a
    run that stopped early leaves the mean to those that went on."""
    grid = np.unique(np.concatenate([np.asarray(x, dtype=float) for x, _ in curves]))
    grid = grid[~np.isnan(grid)]
    at = {}
    for i, (x, y) in enumerate(curves):
        x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        drawn = ~(np.isnan(x) | np.isnan(y))  # a point it lacks is not a point
        order = np.argsort(x[drawn], kind="stable")
        at[i] = (
            np.interp(grid, x[drawn][order], y[drawn][order], left=np.nan, right=np.nan)
            if drawn.any()
            else np.full(len(grid), np.nan)
        )
    values = pd.DataFrame(at, index=grid)
    return pd.DataFrame(
        {
            "x": grid,
            "mean": values.mean(axis=1),
            "low": values.min(axis=1),
            "high": values.max(axis=1),
        }
    ).reset_index(drop=True)


def bytes_axis(events: pd.DataFrame, steps_per_update: int | pd.Series = 1) -> pd.Series | None:
    """The bytes a worker had sent by each event's step (``None`` if the run logs no
    ``comm/bytes_sent``): the train events' bytes per update, times the updates in each interval
    since the previous one (from step 0), summed; any event between two is interpolated by step.
    ``steps_per_update`` may be given per event (indexed like ``events``: an adaptive batch's).
    """
    if not {"comm/bytes_sent", "step", "phase"} <= set(events.columns):
        return None
    train = events[events["phase"] == "train"][["step", "comm/bytes_sent"]].dropna()
    if train.empty:
        return None
    train = train.sort_values("step")
    steps = train["step"].to_numpy(dtype=float)
    if isinstance(steps_per_update, pd.Series):
        steps_per_update = steps_per_update.loc[train.index].to_numpy(dtype=float)
    updates = np.diff(steps, prepend=0.0) / steps_per_update
    total = np.cumsum(train["comm/bytes_sent"].to_numpy(dtype=float) * updates)
    at = pd.to_numeric(events["step"], errors="coerce").to_numpy(dtype=float)
    return pd.Series(np.interp(at, steps, total, left=0.0), index=events.index)


def updates_by_epoch(evals, step_batch: int):
    """The updates an adaptive run had done at each of its ``eval`` events (a DataFrame with
    ``step`` and ``global_batch``, one per epoch, in order): each epoch's steps over its steps per
    update, ``global_batch / step_batch`` (``step_batch``: the examples of one step)."""
    steps = evals["step"].diff().fillna(evals["step"])
    return (steps * step_batch / evals["global_batch"]).cumsum()
