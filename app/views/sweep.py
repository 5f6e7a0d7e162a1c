"""Sweep: a sweep file from experiments/, a grid built from a preset, or a sweep run here
before; what it will cost (cells, workers, time estimated from runs already measured) and the
launch (a background runner through the launch queue; a big sweep asks first); one table of
its cells, their plan and their state, live; results against any axis; the runs in Compare."""

from pathlib import Path

import streamlit as st

from app import data, form
from app.actions import act
from app.columns import RUN_COLUMNS
from app.data import md_escape
from toolkit import safe_yaml
from toolkit.config import ConfigError
from toolkit.launching import sweep as sweeps
from toolkit.launching import sweep_results, sweep_runner
from toolkit.words import counted

REFRESH_S = 2.0
EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
SOURCES = ("A sweep file", "Build a grid", "A sweep run here")
EXAMPLE_GRID = "batch.global_size: [64, 256, 1024]\n"
CELL_COLUMNS = {  # the cells table: the Runs table's labels, and its own columns
    "run_id": RUN_COLUMNS["run_id"],
    "global_batch": RUN_COLUMNS["global_batch"],
    "scaled_lr": st.column_config.NumberColumn("scaled lr", format="%.4g"),
    "total_steps": st.column_config.NumberColumn("steps per worker", format="%d"),
    "queue_position": RUN_COLUMNS["queue"],
    "estimated_s": st.column_config.NumberColumn("estimated (s)", format="%.0f"),
}
CONFIRM_CELLS = 20  # a sweep of more cells launches only once asked to twice
EXAMPLE_METHODS = "linear: {lr_scaling.rule: linear}\nsqrt: {lr_scaling.rule: sqrt}\n"


def built_grid() -> dict:
    """A sweep mapping from the form: a name, a preset as base, the grid and methods (YAML)."""
    left, right = st.columns(2)
    name = left.text_input("Sweep name", value="my-sweep")
    presets = [p for p in form.presets() if p != form.BLANK]
    base = right.selectbox("Base preset", presets, index=presets.index("quickstart"))
    left, right = st.columns(2)
    grid = left.text_area("Grid: config path → values (YAML)", value=EXAMPLE_GRID, height=150)
    methods = right.text_area("Methods: name → overrides (YAML, optional)", EXAMPLE_METHODS)
    seeds = st.text_input("Seeds (YAML list)", value="[0, 1, 2]")
    parsed = {}
    for field, text in (("grid", grid), ("methods", methods), ("seeds", seeds)):
        try:
            value = safe_yaml.load(text, field)
        except safe_yaml.YamlError as error:
            st.error(md_escape(str(error)))
            st.stop()
        if value is not None:
            parsed[field] = value
    return {"name": name, "base": str(form.PRESETS / f"{base}.yaml"), **parsed}


st.title("Sweep")
if flash := st.session_state.pop("sweep_flash", None):
    st.success(md_escape(flash))
source = st.radio("Sweep", SOURCES, horizontal=True, label_visibility="collapsed")
try:
    if source == SOURCES[0]:
        choices = form.experiment_files("grid")
        if not choices:
            st.info("No sweep files under experiments/. Build a grid instead.")
            st.stop()
        grid = sweeps.load(EXPERIMENTS.parent / st.selectbox("Sweep file", choices))
    elif source == SOURCES[1]:
        grid = sweeps.from_mapping(built_grid())
    else:
        saved = {s.name: s for s in sweeps.saved(data.root())}
        if not saved:
            st.info("No sweep has run under this runs root yet.")
            st.stop()
        grid = saved[st.selectbox("Sweep", list(saved))]
except ConfigError as error:
    st.error(md_escape(error))
    st.stop()

root = data.root()
running = sweep_runner.runner_active(grid.name, root)
try:
    cells = data.sweep_plan(grid.to_yaml())
except ConfigError as error:  # a cell that cannot launch here, named
    st.error(md_escape(error))
    st.stop()
startup = sweep_runner.startup(root)
rates = sweep_runner.throughputs(root, summarize=data.summary)
estimated = sweep_runner.estimate(grid, cells, rates, startup)
left, middle, right = st.columns([1, 1, 2])
parallel = left.number_input(
    "Cells at a time", min_value=1, value=sweep_runner.default_parallel(grid, root), step=1
)
retry = middle.checkbox("Rerun failed cells", help="failed or stopped cells run again")
where = st.radio(
    "Where",
    form.where_choices(sets=True),
    horizontal=True,
    help="this machine's launch queue, or Slurm: the cells as one job array",
)
place = form.asked_place(where, "sweep", None)
cost = st.columns(3)
cost[0].metric("Cells", f"{len(cells):,}")
cost[1].metric(
    "Workers per cell", "–".join(map(str, sorted({cells["workers"].min(), cells["workers"].max()})))
)
cost[2].metric(
    "Estimated time",
    sweep_runner.duration(estimated.seconds.sum() / parallel)
    + (" (start-up only)" if (estimated.basis == "start-up").all() else ""),
    help="each cell's start-up, then its training at the samples/s measured by completed runs "
    "of the same dataset, model, workers and batch per worker (else the nearest measured of "
    "the same dataset and model; where there is none, only its start-up), spread over the "
    "cells run at a time",
)
st.caption(md_escape(sweep_runner.cost(estimated, cells, int(parallel), startup)))
big = len(cells) > CONFIRM_CELLS
sure = not big or st.checkbox(f"Yes, run all {counted(len(cells), 'cell')}")
if right.button("Launch sweep", type="primary", disabled=running or not sure, width="stretch"):
    pid = act(
        lambda: sweep_runner.start(
            grid, root, max_parallel=int(parallel), retry_failed=retry, place=place
        )
    )
    st.session_state.sweep_flash = f"Sweep {grid.name} started (runner pid {pid})."
    st.rerun()


@st.fragment(run_every=REFRESH_S if running else None)
def progress() -> None:
    states = sweep_runner.states(grid, root)
    counts = states["state"].value_counts()
    active = sweep_runner.runner_active(grid.name, root)
    st.caption(
        ("a runner is working on this sweep · " if active else "")
        + " · ".join(f"{state}: {n}" for state, n in counts.items())
    )
    shown = cells.assign(state=states["state"], queue_position=states["queue_position"])
    shown["run_id"] = states["run_id"]  # an attempt after a failure has its own id
    st.dataframe(
        shown.assign(estimated_s=estimated.seconds, priced=estimated.basis),
        hide_index=True,
        placeholder="",
        column_config=CELL_COLUMNS,
    )
    table = sweep_results.results(grid, root, events=data.events)
    ended = table[table["state"] != "pending"]
    if ended.empty:
        st.info("No cell has run yet.")
        return
    axes = [a for a in grid.axes() if a != "seed"] or ["seed"]
    metrics = [m for m in sweep_results.METRICS if ended[m].notna().any()]
    left, right = st.columns(2)
    metric = left.selectbox("Metric", metrics, key="sweep_metric")
    x = right.selectbox("Against", axes, index=len(axes) - 1, key="sweep_x")
    st.plotly_chart(sweep_results.figure(table, metric, x=x), key="sweep_chart", theme=None)
    st.dataframe(sweep_results.aggregate(table, (metric,)), hide_index=True, placeholder="")
    left, right = st.columns(2)
    left.download_button("Results (CSV)", table.to_csv(index=False), f"{grid.name}.csv", "text/csv")
    if right.button("Open these runs in Compare", width="stretch"):
        st.session_state.compare_runs = list(ended["run_id"])
        st.switch_page("views/compare.py")
    if running and not active:  # the runner finished: stop refreshing
        st.rerun()


progress()
