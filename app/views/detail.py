"""Run detail: status, progress and curves of one run, refreshed every few seconds while it is
live by a fragment that reads only the new bytes of its events file."""

import streamlit as st

from app import charts, data
from app.charts import Series
from toolkit.rundir import LIVE

REFRESH_S = 2.0

st.title("Run detail")
runs = data.runs()
if not runs:
    st.info("No runs yet. Start one on the Launch page.")
    st.stop()
ids = [r.run_id for r in runs]
wanted = st.session_state.get("current_run") or st.query_params.get("run")
run_id = st.selectbox("Run", ids, index=ids.index(wanted) if wanted in ids else 0)
st.session_state.current_run = run_id
st.query_params["run"] = run_id
run = runs[ids.index(run_id)]
config = data.config(run)
live = run.status().get("state") in LIVE
st.caption("The same run in a notebook (the copy button is on the right):")
st.code(
    "from toolkit import monitor, rundir\n"
    "from toolkit.events import read_events\n\n"
    f"run = rundir.resolve({run.run_id!r}, {str(run.path.parent.resolve())!r})\n"
    "events = read_events(run.events_path)  # every event, a DataFrame\n"
    "monitor.live(run)  # these curves, growing in place until the run ends",
    language="python",
)


def curves(frame, metric: str, title: str, phases=("train", "eval")) -> None:
    series = []
    for name in phases:
        rows = data.phase(frame, name)
        if {"step", metric} <= set(rows.columns):
            series.append(Series(name, rows["step"], rows[metric]))
    if series:
        st.plotly_chart(charts.lines(series, title, height=300))
    else:
        st.text(f"{title}: no data yet")


def noise_scale(rows) -> None:
    """B_simple over training (log y) against the run's global batch, and the newest reading."""
    if "b_simple" not in rows or rows["b_simple"].dropna().empty:
        if (config and config.logging.noise_scale_every_steps) or not rows.empty:
            st.text("Gradient noise scale B_simple: no estimate yet")
        return
    rows = rows.dropna(subset=["b_simple"])
    batch = run.meta().get("global_batch") or (rows["b_big"].iloc[-1] if "b_big" in rows else None)
    newest = float(rows["b_simple"].iloc[-1])
    reading = f"Gradient noise scale B_simple ≈ {newest:,.0f}"
    if batch:
        ratio = batch / newest
        side = "below" if ratio < 1 else "above"
        reading += f": the global batch {batch:,.0f} is {max(ratio, 1 / ratio):.1f}× {side} it"
    st.text(reading)
    series = [Series("B_simple", rows["step"], rows["b_simple"])]
    if batch:  # a line, not a shape: shapes on a log axis take log10 coordinates
        steps = rows["step"].iloc[[0, -1]]
        series.append(Series(f"global batch {batch:,.0f}", steps, [batch, batch]))
    figure = charts.lines(series, "B_simple against the global batch", log_y=True, height=300)
    st.plotly_chart(figure)


@st.fragment(run_every=REFRESH_S if live else None)
def panel() -> None:
    status = run.status()
    state = status.get("state")
    if live and state not in LIVE:
        st.rerun()  # it just ended: redraw the page once more, without the timer
    frame = data.live_events(run)
    details = [f"state: {state}"] + [
        f"{key}: {status[key]}"
        for key in ("pid", "exit_code", "reason")
        if status.get(key) is not None
    ]
    st.text("    ".join(details))
    if config is None:
        st.text("config.yaml is missing or not valid: no progress to show")
    else:
        epochs = frame["epoch"].dropna() if "epoch" in frame else frame.index[:0]
        epoch = float(epochs.iloc[-1]) if len(epochs) else 0.0
        done = 1.0 if state == "completed" else min(1.0, max(0.0, epoch / config.epochs))
        st.progress(done, text=f"epoch {epoch:.2f} of {config.epochs}")
    if frame.empty:
        st.text("No events yet.")
        return
    left, right = st.columns(2)
    with left:
        curves(frame, "loss", "loss")
        curves(frame, "lr", "learning rate", phases=("train",))
    with right:
        curves(frame, "accuracy", "accuracy")
        curves(frame, "samples_per_sec", "samples/sec", phases=("train",))
    if "comm/bytes_sent" in frame:
        left, right = st.columns(2)
        with left:
            curves(frame, "comm/bytes_sent", "bytes a worker sent per update", ("train",))
        with right:
            curves(frame, "comm/compression_ratio", "compression (dense bytes / sent)", ("train",))
    noise_scale(data.phase(frame, "gns"))
    ratios = data.phase(frame, "trust_ratio")
    if not ratios.empty or (config and config.optimizer.name in ("lars", "lbsgd")):
        figure = charts.trust_heatmap(ratios)
        if figure is None:
            st.text("Per-layer trust ratio: no trust_ratio events yet")
        else:
            st.plotly_chart(figure)
    with st.expander("Latest events"):
        st.dataframe(frame.tail(50), hide_index=True)


panel()
