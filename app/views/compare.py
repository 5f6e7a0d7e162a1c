"""Compare: several runs overlaid per metric, against step, epoch, wall-clock or relative time,
or the bytes a worker sent, EMA-smoothed with the raw curve faint behind; values at a step,
min/max/last, CSV export."""

import pandas as pd
import streamlit as st

from app import charts, data
from app.charts import Series
from toolkit.curves import bytes_axis

X_AXES = {
    "step": "step",
    "epoch": "epoch",
    "wall-clock": "wall-clock (UTC)",
    "relative time": "time since the run's first event (s)",
    "bytes sent": "bytes a worker sent (cumulative)",
}
NOT_METRICS = {"step", "epoch", "wall", "phase"}
MAX_STEP = 2**53 - 1  # the largest whole number a browser's number input holds
DEFAULT_METRICS = ["train/loss", "eval/loss", "eval/accuracy"]
PHASES = ("train", "eval", "gns")  # gns: the gradient noise scale (gns/b_simple)

st.title("Compare runs")
runs = data.runs()
if not runs:
    st.info("No runs yet. Start one on the Launch page.")
    st.stop()
by_id = {r.run_id: r for r in runs}
remembered = [r for r in st.session_state.get("compare_runs", []) if r in by_id]
chosen = st.multiselect("Runs", list(by_id), default=remembered or list(by_id)[:5])
st.session_state.compare_runs = chosen
if not chosen:
    st.info("Choose one or more runs.")
    st.stop()

frames = {run_id: data.events(by_id[run_id]) for run_id in chosen}
phases = {
    (run_id, name): data.phase(frame, name) for run_id, frame in frames.items() for name in PHASES
}
metrics = sorted(
    {
        f"{name}/{column}"
        for (_, name), rows in phases.items()
        for column in rows.select_dtypes("number").columns
        if column not in NOT_METRICS
    }
)
controls = st.columns([3, 2, 2, 1])
shown = controls[0].multiselect(
    "Metrics", metrics, default=[m for m in DEFAULT_METRICS if m in metrics]
)
x_axis = controls[1].radio("x-axis", list(X_AXES), horizontal=True)
smoothing = controls[2].slider("EMA smoothing", 0.0, 0.99, 0.6, 0.01)
log_y = controls[3].checkbox("log y")


def x_values(run_id: str, rows: pd.DataFrame) -> pd.Series | None:
    if x_axis in ("step", "epoch"):
        return rows.get(x_axis)
    if x_axis == "bytes sent":  # runs that log no traffic (one worker, older runs) are left out
        config = data.config(by_id[run_id])
        sent = bytes_axis(frames[run_id], config.steps_per_update() if config else 1)
        return None if sent is None else sent.loc[rows.index]
    if "wall" not in rows:
        return None
    if x_axis == "wall-clock":
        return pd.to_datetime(rows["wall"], unit="s")
    return rows["wall"] - frames[run_id]["wall"].min()


for metric in shown:
    name, column = metric.split("/", 1)
    series = []
    for run_id in chosen:
        rows = phases[run_id, name]
        if column in rows and (x := x_values(run_id, rows)) is not None:
            series.append(Series(run_id, x, rows[column]))
    figure = charts.lines(
        series, metric, X_AXES[x_axis], smoothing=smoothing, log_y=log_y, height=380
    )
    st.plotly_chart(figure)

last_steps = [rows["step"].max() for rows in phases.values() if "step" in rows and not rows.empty]
last_step = max((s for s in last_steps if 0 <= s <= MAX_STEP), default=0)  # no junk steps
at_step = st.number_input("Values at step", min_value=0, value=int(last_step), step=1)
table = []
for metric in shown:
    name, column = metric.split("/", 1)
    for run_id in chosen:
        rows = phases[run_id, name]
        if column not in rows or "step" not in rows:
            continue
        values = rows[["step", column]].apply(pd.to_numeric, errors="coerce").dropna()
        before = values[values["step"] <= at_step]
        table.append(
            {
                "run": run_id,
                "metric": metric,
                f"at step {at_step}": before[column].iloc[-1] if len(before) else None,
                "min": values[column].min(),
                "max": values[column].max(),
                "last": values[column].iloc[-1] if len(values) else None,
                "last step": values["step"].iloc[-1] if len(values) else None,
            }
        )
st.dataframe(pd.DataFrame(table), hide_index=True)
st.download_button(
    "Download the selected runs' events (CSV)",
    data=lambda: data.events_csv([by_id[r] for r in chosen]),
    file_name="events.csv",
    mime="text/csv",
    on_click="ignore",
)
