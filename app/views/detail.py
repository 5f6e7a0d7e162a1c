"""Run detail: what the run is and how it went (a summary line), Stop while it is live, and its
curves in the run's own colour against the x-axis and smoothing of your choice, refreshed every
few seconds while it is live by a fragment that reads only the new bytes of its events file."""

import time

import numpy as np
import streamlit as st

from app import charts, data
from app.actions import act
from app.axes import X_AXES, x_values
from app.charts import Series
from app.data import md_escape
from toolkit import advice, backends
from toolkit.launching import launch as launcher
from toolkit.plan import Scale
from toolkit.runs import checkpoints, placement, table
from toolkit.runs import curves as curves_lib
from toolkit.runs.rundir import LIVE
from toolkit.runs.states import State
from toolkit.scaling.noise_scale import GROWS
from toolkit.words import counted

REFRESH_S = 2.0
BAND_READINGS = 10  # B_simple's band: the spread of its last readings
FEWEST_FOR_A_BAND = 3

st.title("Run detail")
runs = data.runs()
if not runs:
    st.info("No runs yet. Start one on the Launch page.")
    st.stop()
ids = [r.run_id for r in runs]
if st.session_state.get("detail_run") not in ids:  # on arrival: the run chosen elsewhere
    wanted = st.session_state.get("current_run") or st.query_params.get("run")
    st.session_state.detail_run = wanted if wanted in ids else ids[0]
run_id = st.selectbox("Run", ids, key="detail_run")
st.session_state.current_run = run_id
st.query_params["run"] = run_id
run = runs[ids.index(run_id)]
config = data.config(run)
scale = Scale.of(config) if config else None  # the run's batch and rate on its workers
color = data.color(run)
live = run.status().get("state") in LIVE
tags, notes = run.tags(), run.notes()  # meta.json, read once each
labels = ([f"tags: {', '.join(tags)}"] if tags else []) + ([f"notes: {notes}"] if notes else [])
if labels:
    st.caption(md_escape("  ·  ".join(labels)))
with st.expander("Config"):
    st.code(data.text(run.config_path) or "(no config.yaml)", language="yaml")
with st.expander("Open this run in a notebook"):
    st.code(
        "from toolkit.runs import monitor, rundir\n"
        "from toolkit.runs.events import read_events\n\n"
        f"run = rundir.resolve({run.run_id!r}, {str(run.path.parent.resolve())!r})\n"
        "events = read_events(run.events_path)  # every event, a DataFrame\n"
        "monitor.live(run)  # these curves, growing in place until the run ends",
        language="python",
    )
controls = st.columns([3, 2, 1])
x_axis = controls[0].radio("x-axis", list(X_AXES), horizontal=True)
smoothing = controls[1].slider("EMA smoothing", 0.0, 0.99, charts.SMOOTHING, 0.01)
if controls[2].button("Stop", disabled=not live, width="stretch", help="stop this run"):
    act(lambda: launcher.stop(run_id, data.root(), by="the app"))
    st.rerun()


def setup_line(frame) -> str:
    """What the run is: optimizer, batch, workers, schedule (with its warmup) and epochs; the
    highest rate its events reached too, where that falls short of the scaled rate (a warm-up
    cut short by the decay, or a run still warming up)."""
    if config is None:
        return "config.yaml is missing or not valid"
    warmup = config.schedule.warmup.epochs
    schedule = config.schedule.name + (
        f" after {counted(warmup, 'warmup epoch')}" if warmup else ""
    )
    rate, epochs = f"lr {scale.learning_rate:.4g}", f"{config.epochs} epochs"
    rates = data.phase(frame, "train").get("lr", frame.index[:0]).dropna()
    if adascale_run():
        rate += f" × AdaScale's gain (base batch {config.lr_scaling.base_batch:,})"
        epochs = f"the base run's {config.epochs} epochs on AdaScale's clock"
    elif len(rates) and rates.max() < advice.PEAK_SHORT * scale.learning_rate:
        rate += f" (highest reached {rates.max():.4g})"
    batch = f"global batch {scale.global_batch:,}"
    if adaptive := config.batch.adaptive:
        every = "every epoch" if adaptive.every_epochs == 1 else f"every {adaptive.every_epochs}"
        aim = f", aiming at {adaptive.aim:g} × B_simple" if adaptive.aim != 1 else ""
        steady = f", hysteresis {adaptive.hysteresis:g}" if adaptive.hysteresis else ""
        batch = f"adaptive global batch {adaptive.min:,} to {adaptive.max:,} ({every}{aim}{steady})"
    on = backends.recorded(run.meta())
    return (
        f"{config.optimizer.name} · {batch} on "
        f"{counted(config.workers, 'worker')}{f' ({on})' if on else ''} · {rate} · {schedule} · "
        f"{epochs}"
    )


def adascale_run() -> bool:
    return config is not None and config.lr_scaling.rule == "adascale"


def noise_reading(rows) -> str | None:
    """``B_simple`` as the median of its last readings with their 10-90% band, against the
    global batch; with too few readings, said to be too few."""
    if "b_simple" not in rows or rows["b_simple"].dropna().empty:
        return None
    readings = rows["b_simple"].dropna().to_numpy(dtype=float)[-BAND_READINGS:]
    middle = float(np.median(readings))
    if len(readings) < FEWEST_FOR_A_BAND:
        said = f"B_simple ≈ {middle:,.0f} from {len(readings)} reading(s): too few to trust"
    else:
        low, high = np.percentile(readings, [10, 90])
        said = (
            f"B_simple ≈ {middle:,.0f} over this run's last {len(readings)} readings "
            f"({low:,.0f}–{high:,.0f})"
        )
    batch = scale.global_batch if scale else run.meta().get("global_batch")
    if batch:
        ratio = batch / middle
        side = "below" if ratio < 1 else "above"
        said += f"; the global batch {batch:,} is {max(ratio, 1 / ratio):.1f}× {side} it"
    return f"{said}. {GROWS}."


def curves(frame, metric: str, title: str, phases=("train", "eval")) -> None:
    """``metric`` of each phase, in the run's colour (train solid, eval dashed)."""
    series = []
    for name, dash in zip(phases, ("solid", "dash"), strict=False):
        rows = data.phase(frame, name)
        x = x_values(frame, rows, x_axis, config) if metric in rows else None
        if x is not None:
            exact = metric in curves_lib.EXACT
            series.append(Series(name, x, rows[metric], color=color, dash=dash, exact=exact))
    if series:
        figure = charts.lines(series, title, X_AXES[x_axis], smoothing=smoothing, height=300)
        mark_resets(figure, frame)
        st.plotly_chart(figure, theme=None)
    else:
        st.text(f"{title}: no data yet")


def mark_resets(figure, frame) -> None:
    """A dotted vertical line at each reset of an elastic run (its ``elastic`` events)."""
    rows = data.phase(frame, "elastic")
    x = x_values(frame, rows, x_axis, config) if not rows.empty else None
    for at in [] if x is None else x:
        figure.add_vline(x=at, line={"dash": "dot", "color": "#888888", "width": 1})


def elastic_resets(frame) -> None:
    """An elastic run's workers over training, and a line per reset: where, why, from how many
    workers to how many, on which hosts, and how many steps were trained again."""
    rows = data.phase(frame, "elastic")
    if rows.empty and not (config and config.elastic):
        return
    curves(frame, "world_size", "workers (elastic)", phases=("train",))
    for reset in rows.to_dict("records"):
        st.caption(
            md_escape(
                f"step {reset['step']:.0f}: {reset.get('reason')}, "
                f"{reset.get('previous_world_size', float('nan')):.0f} → "
                f"{reset.get('world_size', float('nan')):.0f} workers on {reset.get('hosts')}; "
                f"{reset.get('steps_lost', 0):.0f} steps trained again"
            )
        )


def adascale(frame) -> None:
    """An AdaScale run's gain against its scale ``S`` (the most it can be), and its clock ``τ``
    (the base run's updates done) against the steps."""
    rows = data.phase(frame, "train")
    if "gain" not in rows:
        if adascale_run():
            st.text("AdaScale: no gain yet")
        return
    rows = rows.dropna(subset=["gain"])
    x = x_values(frame, rows, x_axis, config)
    if x is None or rows.empty:
        return
    left, right = st.columns(2)
    with left:
        series = [Series("gain", x, rows["gain"], color=color)]
        if adascale_run():
            base = config.lr_scaling.base_batch
            scales = rows.get("global_batch", frame.index[:0]).dropna() / base
            if scales.nunique() > 1:  # an adaptive batch's
                series.append(Series("S", x.loc[scales.index], scales, dash="dot", exact=True))
            else:
                ratio = scale.global_batch / base
                series.append(
                    Series(f"S = {ratio:g}", x.iloc[[0, -1]], [ratio] * 2, dash="dot", exact=True)
                )
        title = "AdaScale's gain against S"
        figure = charts.lines(series, title, X_AXES[x_axis], smoothing=smoothing, height=300)
        st.plotly_chart(figure, theme=None)
    with right:
        curves(frame, "tau", "AdaScale's clock τ (base-run updates)", phases=("train",))


def traffic(frame) -> None:
    """Bytes and compression per update where the run compresses; one line where it sends
    dense gradients (a flat line says nothing a number does not)."""
    rows = data.phase(frame, "train")
    if "comm/bytes_sent" not in rows:
        return
    if config is not None:
        st.caption(md_escape(f"On the wire: {config.communication().summary()}"))
    if dense(frame):
        sent = rows["comm/bytes_sent"].dropna()
        st.text(f"Traffic: each worker sends {sent.iloc[-1]:,.0f} bytes per update (dense)")
        return
    left, right = st.columns(2)
    with left:
        every = config.logging.every_steps if config is not None else None
        window = f" (mean over the {every} steps to each event)" if every else ""
        curves(frame, "comm/bytes_sent", f"bytes rank 0 sent per update{window}", ("train",))
    with right:
        curves(frame, "comm/compression_ratio", "compression (dense bytes / sent)", ("train",))


def dense(frame) -> bool:
    """Whether the run sends dense gradients: it logs no compression, or a ratio of 1."""
    ratios = data.phase(frame, "train").get("comm/compression_ratio")
    return ratios is None or np.allclose(ratios.dropna(), 1.0)


def noise_scale(frame) -> None:
    """B_simple over training (log y) against the run's global batch."""
    rows = data.phase(frame, "gns")
    if "b_simple" not in rows or rows["b_simple"].dropna().empty:
        if (config and config.logging.noise_scale_every_steps) or not rows.empty:
            said = "no estimate yet" if live else "this run logged no estimate"
            st.text(f"Gradient noise scale B_simple: {said}")
        return
    rows = rows.dropna(subset=["b_simple"])
    x = x_values(frame, rows, x_axis, config)
    if x is None:
        return
    series = [Series("B_simple", x, rows["b_simple"], color=color)]
    train = data.phase(frame, "train")
    batches = train.get("global_batch", frame.index[:0]).dropna()
    batch = scale.global_batch if scale else run.meta().get("global_batch")
    grew = batches.nunique() > 1  # an adaptive batch's
    at = x_values(frame, train.loc[batches.index], x_axis, config) if grew else None
    if at is not None:
        series.append(Series("global batch", at, batches, dash="dot"))
    elif batch:  # a line, not a shape: shapes on a log axis take log10 coordinates
        ends = x.iloc[[0, -1]]
        series.append(Series(f"global batch {batch:,}", ends, [batch, batch], dash="dot"))
    title = "B_simple against the global batch"
    st.plotly_chart(charts.lines(series, title, X_AXES[x_axis], log_y=True, height=300), theme=None)


def system_metrics(frame) -> None:
    """Each worker's CPU, memory (and GPU memory) over training, a curve per rank, two charts a
    row (``system`` events, :mod:`toolkit.training.system`)."""
    rows = data.phase(frame, "system")
    x = x_values(frame, rows, x_axis, config) if not rows.empty else None
    if x is None:
        return
    st.caption("System, per worker")
    found = list(curves_lib.panels(rows).items())
    if dense(frame):  # its bytes are the traffic line's number, the same at every sample
        found = [(title, drawn) for title, drawn in found if title != "bytes_sent_per_update"]
    for start in range(0, len(found), 2):
        for column, (title, drawn) in zip(st.columns(2), found[start : start + 2], strict=False):
            series = [Series(c.name.replace("rank", "rank "), x, rows[c.column]) for c in drawn]
            name = curves_lib.TITLES.get(title, title)
            if title == "bytes_sent_per_update" and config is not None:  # its window, said
                every = config.logging.every_steps * config.logging.system_every_events
                name += f" (mean over the {every} steps to each sample)"
            with column:
                st.plotly_chart(charts.lines(series, name, X_AXES[x_axis], height=260), theme=None)


@st.fragment(run_every=REFRESH_S if live else None)
def panel() -> None:
    status = run.status()
    state = status.get("state")
    if live and state not in LIVE:
        st.rerun()  # it just ended: redraw the page once more, without the timer
    frame = data.live_events(run)
    shown = ("pid", "reason") if state in LIVE else ("exit_code", "reason")
    details = [f"state: {state}", f"where: {placement.where(status)}"] + [
        f"{key}: {status[key]}" for key in shown if status.get(key) is not None
    ]
    if resumed := checkpoints.resumed_text(status):
        details.append(f"resumed {resumed}")
    st.text("    ".join(details))
    row = data.summary(run)
    if silent := table.silence(row, time.time()):
        st.warning(md_escape(silent.capitalize()))
    if state not in LIVE and (damaged := data.damaged_checkpoint(run)):
        st.warning(md_escape(damaged))
    outcome = table.outcome_text(row)
    st.markdown(f"**{md_escape(setup_line(frame))}**  \n{md_escape(outcome)}")
    if reading := noise_reading(data.phase(frame, "gns")):
        st.caption(md_escape(reading))
    if adascale_run() and (total := run.meta().get("total_steps")):
        taus = data.phase(frame, "train").get("tau", frame.index[:0]).dropna()
        tau = total if state == State.COMPLETED else float(taus.iloc[-1] if len(taus) else 0)
        st.progress(min(1.0, tau / total), text=f"τ {tau:,.0f} of {total:,} base-run updates")
    elif config is not None:
        epochs = data.phase(frame, "train").get("epoch", frame.index[:0]).dropna()
        epoch = (
            config.epochs
            if state == State.COMPLETED
            else float(epochs.iloc[-1] if len(epochs) else 0)
        )
        done = min(1.0, max(0.0, epoch / config.epochs))
        st.progress(done, text=f"epoch {round(epoch, 2):g} of {config.epochs}")
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
    adascale(frame)
    elastic_resets(frame)
    traffic(frame)
    noise_scale(frame)
    system_metrics(frame)
    ratios = data.phase(frame, "trust_ratio")
    if not ratios.empty or (config and config.optimizer.applies_trust_ratios()):
        figure = charts.trust_heatmap(ratios)
        if figure is None:
            st.text("Per-layer trust ratio: no trust_ratio events yet")
        else:
            st.plotly_chart(figure, theme=None)
    with st.expander("Latest events"):
        st.dataframe(frame.tail(50), hide_index=True, placeholder="")


panel()
