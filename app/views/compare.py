"""Compare: several runs overlaid per metric, each in its own colour (the same on every page),
against any of :data:`app.axes.X_AXES`, EMA-smoothed with the raw curve faint behind, or grouped
by a config field into each value's mean over its min-max band; values at a step,
min/max/last; any config field against any outcome, a point per run; CSV export. The address
names the chosen runs (``?run=a&run=b``), so a comparison can be shared as a link.

Built for 100 runs of 50,000 events: each run's phases are read once per change of its file
(``data.phases``), each chart is built once per set of controls and runs (``figure``), and
curves are downsampled for drawing while the table and the CSV keep every event."""

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app import charts, data
from app.axes import X_AXES, x_values
from app.charts import Series
from toolkit.runs import curves
from toolkit.runs.curves import EXACT
from toolkit.runs.theme import COLORS

NOT_METRICS = {"step", "epoch", "wall", "phase"}
MAX_STEP = 2**53 - 1  # the largest whole number a browser's number input holds
DEFAULT_METRICS = ["train/loss", "eval/loss", "eval/accuracy"]
DEFAULT_RUNS = 5
PHASES = ("train", "eval", "gns")  # gns: the gradient noise scale (gns/b_simple)
OUTCOMES = {  # the runs table's columns a run's config is plotted against, by their names
    "best eval accuracy": "best_eval_accuracy",
    "last eval accuracy": "last_eval_accuracy",
    "best eval loss": "best_eval_loss",
    "last train loss": "last_loss",
    "samples/s": "samples_per_sec",
    "duration (s)": "duration_s",
}

st.title("Compare runs")
runs = data.runs()
if not runs:
    st.info("No runs yet. Start one on the Launch page.")
    st.stop()
by_id = {r.run_id: r for r in runs}
if "compare_widget" not in st.session_state:  # first visit: a shared link, or where we left
    linked = [r for r in st.query_params.get_all("run") if r in by_id]
    remembered = [r for r in st.session_state.get("compare_runs", []) if r in by_id]
    newest = [r.run_id for r in runs if not r.meta().get("probe")][:DEFAULT_RUNS]  # as on Runs
    st.session_state.compare_widget = linked or remembered or newest
else:  # runs deleted meanwhile leave the selection
    st.session_state.compare_widget = [r for r in st.session_state.compare_widget if r in by_id]
chosen = st.multiselect("Runs", list(by_id), key="compare_widget")
st.session_state.compare_runs = chosen  # kept when the page is left (its widget's state is not)
st.query_params["run"] = chosen  # the page's address names its runs: a link to this comparison
if not chosen:
    st.info("Choose one or more runs.")
    st.stop()

split = {run_id: data.phases(by_id[run_id]) for run_id in chosen}
colors = {run_id: data.color(by_id[run_id]) for run_id in chosen}
# what the charts and the table depend on: each chosen run's directory, events' stamp and colour
drawn = tuple((str(by_id[r].path), data.stamp(by_id[r].events_path), colors[r]) for r in chosen)
NONE = pd.DataFrame()


def rows_of(run_id: str, name: str) -> pd.DataFrame:
    return split[run_id].get(name, NONE)


metrics = sorted(
    {
        f"{name}/{column}"
        for parts in split.values()
        for name, rows in parts.items()
        if name in PHASES
        for column in rows.select_dtypes("number").columns
        if column not in NOT_METRICS
    }
)
controls = st.columns([3, 2, 2, 1])
shown = controls[0].multiselect(
    "Metrics", metrics, default=[m for m in DEFAULT_METRICS if m in metrics]
)
x_axis = controls[1].radio("x-axis", list(X_AXES), horizontal=True)
smoothing = controls[2].slider("EMA smoothing", 0.0, 0.99, charts.SMOOTHING, 0.01)
log_y = controls[3].checkbox("log y")
fields = data.config_columns([by_id[r] for r in chosen])  # the config, a column per field
configs = fields.astype(str)
varying = [field for field in configs.columns if configs[field].nunique() > 1]
group = st.selectbox(
    "Group runs by",
    [None, *varying],
    format_func=lambda field: "nothing: a curve per run" if field is None else field,
    help="a config field whose value differs between the chosen runs: each value's runs drawn "
    "as their mean over their min-max band (seeds, say)",
)


def curve(run_id: str, name: str, column: str) -> tuple[pd.Series, pd.Series] | None:
    """``(x, y)`` of ``column`` of the run's ``name`` phase on the chosen axis; ``None`` where
    the run lacks either."""
    rows, run = rows_of(run_id, name), by_id[run_id]
    x = x_values(data.events(run), rows, x_axis, data.config(run)) if column in rows else None
    return None if x is None else (x, rows[column])


@st.cache_resource(max_entries=24, show_spinner=False)
def figure(
    metric: str, x_axis: str, smoothing: float, log_y: bool, group: str | None, runs: tuple
) -> go.Figure:
    """The chart of ``metric`` (built again only when a control or a drawn run changed; the
    arguments are its whole key, ``runs`` standing for the chosen runs): a curve per run, or
    with ``group`` a band per value of that config field."""
    name, column = metric.split("/", 1)
    exact = column in EXACT
    found = {run_id: xy for run_id in chosen if (xy := curve(run_id, name, column)) is not None}
    if group is None:
        series = [
            Series(run_id, x, y, color=colors[run_id], exact=exact)
            for run_id, (x, y) in found.items()
        ]
        return charts.lines(
            series, metric, X_AXES[x_axis], smoothing=smoothing, log_y=log_y, height=380
        )
    groups, values = [], configs.reindex(list(found))[group].fillna("(no config)")
    wall = x_axis == "wall-clock"  # times: spread as nanoseconds, drawn as times again
    for value, members in values.groupby(values, sort=True).groups.items():
        smoothed = [
            (x.astype("int64") if wall else x, y if exact else charts.ema(y, smoothing))
            for x, y in (found[r] for r in members)
        ]
        band = curves.spread(smoothed)
        band["x"] = pd.to_datetime(band["x"]) if wall else band["x"]
        runs_said = f"{len(members)} run{'s' * (len(members) > 1)}"
        groups.append(
            charts.Band(
                f"{group}={value} ({runs_said})",
                band,
                COLORS[len(groups) % len(COLORS)],
            )
        )
    return charts.bands(groups, metric, X_AXES[x_axis], log_y=log_y, height=380)


for metric in shown:
    st.plotly_chart(figure(metric, x_axis, smoothing, log_y, group, drawn), theme=None)

charted = [rows_of(run_id, name) for run_id in chosen for name in PHASES]
last_steps = [rows["step"].max() for rows in charted if "step" in rows]
last_step = max((s for s in last_steps if 0 <= s <= MAX_STEP), default=0)  # no junk steps
at_step = st.number_input("Values at step", min_value=0, value=int(last_step), step=1)


@st.cache_data(max_entries=24, show_spinner=False)
def values_at(shown: tuple[str, ...], at_step: int, runs: tuple) -> pd.DataFrame:
    """Each shown metric of each run at ``at_step`` (its last value at or before; none where
    the run's training had not reached ``at_step``), with its min, max and last value, at full
    resolution."""
    table = []
    for metric in shown:
        name, column = metric.split("/", 1)
        for run_id in chosen:
            rows = rows_of(run_id, name)
            if column not in rows or "step" not in rows:
                continue
            values = rows[["step", column]].dropna()
            trained = rows_of(run_id, "train").get("step", values["step"]).max()
            reached = values["step"] <= at_step if at_step <= trained else values["step"] < 0
            before = values[column][reached]
            table.append(
                {
                    "run": run_id,
                    "metric": metric,
                    f"at step {at_step}": before.iloc[-1] if len(before) else None,
                    "min": values[column].min(),
                    "max": values[column].max(),
                    "last": values[column].iloc[-1] if len(values) else None,
                    "last step": values["step"].iloc[-1] if len(values) else None,
                }
            )
    return pd.DataFrame(table)


st.dataframe(values_at(tuple(shown), at_step, drawn), hide_index=True, placeholder="")
against = "Config against outcome"
if not fields.empty and st.toggle(against, help="a point per run: any config field, any outcome"):
    summaries = pd.DataFrame([data.summary(by_id[r]) for r in chosen])
    outcomes = summaries[["run_id", *OUTCOMES.values()]].join(fields, on="run_id")
    left, middle, right = st.columns(3)
    columns = list(fields.columns)
    x_field = left.selectbox("Config field", columns, index=columns.index([*varying, *columns][0]))
    outcome = middle.selectbox("Outcome", list(OUTCOMES))
    color_by = right.selectbox("Colour by", [None, *varying], format_func=lambda f: f or "nothing")
    scatter = charts.scatter(outcomes, x_field, OUTCOMES[outcome], color_by, outcome)
    st.plotly_chart(scatter, theme=None)
st.download_button(
    "Download the selected runs' events (CSV)",
    data=lambda: data.events_csv([by_id[r] for r in chosen]),
    file_name="events.csv",
    mime="text/csv",
    on_click="ignore",
)
