"""The x-axes a run's curves are drawn against, the same on Run detail and Compare: step,
epoch, samples seen, wall-clock, time since the run's first event, and bytes a worker sent."""

from __future__ import annotations

import pandas as pd

from toolkit.config import ExperimentConfig
from toolkit.plan import Scale
from toolkit.runs.curves import bytes_axis

X_AXES = {
    "step": "step",
    "epoch": "epoch",
    "samples seen": "samples seen (all workers)",
    "relative time": "time since the run's first event (s)",
    "wall-clock": "wall-clock (UTC)",
    "bytes sent": "bytes a worker sent (cumulative)",
}
"""Each axis and the title it is drawn with."""


def x_values(
    events: pd.DataFrame, rows: pd.DataFrame, x_axis: str, config: ExperimentConfig | None
) -> pd.Series | None:
    """The x of each of ``rows`` (some of the run's ``events``, by the same index) on
    ``x_axis``, or ``None`` where the run lacks what the axis needs: a config for samples (a step
    is ``global batch / steps per update`` examples), logged traffic for bytes, wall times."""
    if x_axis in ("step", "epoch"):
        return rows.get(x_axis)
    scale = Scale.of(config) if config else None
    steps_per_update = scale.steps_per_update if scale else 1
    step_batch = scale.examples_per_step if scale else None
    if x_axis == "samples seen":
        if config is None or "step" not in rows:
            return None
        return rows["step"] * step_batch
    if x_axis == "bytes sent":  # runs that log no traffic (one worker, older runs) are left out
        if step_batch and "global_batch" in events:  # an adaptive batch's, event by event
            steps_per_update = events["global_batch"] / step_batch
        sent = bytes_axis(events, steps_per_update)
        return None if sent is None else sent.loc[rows.index]
    if "wall" not in rows or "wall" not in events:
        return None
    if x_axis == "wall-clock":
        return pd.to_datetime(rows["wall"], unit="s")
    return rows["wall"] - events["wall"].min()
