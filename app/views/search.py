"""Search: a search file from experiments/, one written here, or a search run here before; its
space in words and the launch (a background runner through the launch queue); then, live, its
trials (each linking to its Run detail), the best of them beside the task's noise scale, and
Optuna's own figures: optimisation history, parameter importance, parallel coordinates."""

from pathlib import Path
from urllib.parse import quote

import pandas as pd
import streamlit as st

from app import data, form
from app.actions import act
from app.columns import RUN_COLUMNS
from app.data import md_escape
from toolkit import safe_yaml
from toolkit.config import ConfigError
from toolkit.launching import search as searches
from toolkit.launching import search_runner
from toolkit.runs import theme
from toolkit.runs.rundir import RunDir
from toolkit.scaling import critical_batch

REFRESH_S = 2.0
EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
SOURCES = ("A search file", "Write one", "A search run here")
EXAMPLE = """\
name: my-search
base: experiments/quickstart.yaml
space:
  optimizer.learning_rate: {low: 0.1, high: 4.0, log: true}
  optimizer.params.momentum: {low: 0.8, high: 0.99}
trials: 12
sampler: tpe
pruner: asha
objective: {metric: accuracy, at: last}
"""
TRIAL_COLUMNS = {
    "run_id": None,
    "open": st.column_config.LinkColumn(
        "run", display_text=r"run=(.+)$", help="open the trial's Run detail", pinned=True
    ),
    "value": st.column_config.NumberColumn("objective", format="%.4f"),
    "global_batch": RUN_COLUMNS["global_batch"],
    "noise_scale": st.column_config.NumberColumn(
        "B_simple", format="%.0f", help="the run's noise scale, if it measured it"
    ),
}
NOISE_READINGS = 10
FIGURES = {  # Optuna's own figures, by their title here
    "Optimisation history": "plot_optimization_history",
    "Parameter importance": "plot_param_importances",
    "Parallel coordinates": "plot_parallel_coordinate",
}


def chosen() -> searches.Search:
    """The search the page is about, from the source picked; a bad one is named, the page
    stopped."""
    source = st.radio("Search", SOURCES, horizontal=True, label_visibility="collapsed")
    try:
        if source == SOURCES[0]:
            if not (files := form.experiment_files("space")):
                st.info("No search files under experiments/. Write one instead.")
                st.stop()
            return searches.load(EXPERIMENTS.parent / st.selectbox("Search file", files))
        if source == SOURCES[1]:
            text = st.text_area("Search file (YAML)", value=EXAMPLE, height=260)
            return searches.from_mapping(safe_yaml.load(text, "search"), EXPERIMENTS.parent)
        saved = {s.name: s for s in searches.saved(data.root())}
        if not saved:
            st.info("No search has run under this runs root yet.")
            st.stop()
        return saved[st.selectbox("Search run here", list(saved))]
    except (ConfigError, safe_yaml.YamlError) as error:
        st.error(md_escape(error))
        st.stop()


def figure(name: str, study):
    """Optuna's figure ``name`` of ``study`` in the lab's look; ``None`` where Optuna cannot
    draw it yet (parameter importance needs two completed trials that differ)."""
    import optuna.visualization as vis

    try:
        drawn = getattr(vis, FIGURES[name])(study)
    except (ValueError, RuntimeError, ZeroDivisionError):
        return None
    return drawn.update_layout(template=theme.NAME, title=None)


def with_runs(trials: pd.DataFrame) -> pd.DataFrame:
    """``trials`` with each run's link, global batch and noise scale (the median of its
    events' last :data:`NOISE_READINGS` ``B_simple`` readings, where it measured them)."""
    batches, noise = [], []
    for run_id in trials["run_id"]:
        run = data.find(run_id) if isinstance(run_id, str) else None
        batches.append(data.summary(run)["global_batch"] if run else None)
        gns = data.phases(run).get("gns", pd.DataFrame()) if run else pd.DataFrame()
        readings = gns["b_simple"].dropna().tail(NOISE_READINGS) if "b_simple" in gns else []
        noise.append(float(pd.Series(readings).median()) if len(readings) else None)
    links = "detail?run=" + trials["run_id"].fillna("").map(lambda r: quote(r, safe=""))
    return trials.assign(open=links, global_batch=batches, noise_scale=noise)


st.title("Search")
if flash := st.session_state.pop("search_flash", None):
    st.success(md_escape(flash))
search = chosen()
root = data.root()
st.code(search.space_text(), language=None)
running = search_runner.runner_active(search.name, root)
left, right = st.columns([1, 3])
parallel = left.number_input("Trials at a time", min_value=1, value=2, step=1)
if right.button("Start search", type="primary", disabled=running, width="stretch"):
    pid = act(lambda: search_runner.start(search, root, max_parallel=int(parallel)))
    st.session_state.search_flash = f"Search {search.name} started (runner pid {pid})."
    st.rerun()


@st.fragment(run_every=REFRESH_S if running else None)
def progress() -> None:
    trials = search_runner.trials(search, root)
    active = search_runner.runner_active(search.name, root)
    counts = trials["state"].value_counts() if len(trials) else pd.Series(dtype=int)
    st.caption(
        ("a runner is working on this search · " if active else "")
        + " · ".join(f"{state}: {n}" for state, n in counts.items())
    )
    if trials.empty:
        st.info("No trial has been asked yet.")
        return
    if unfollowed := search_runner.unfollowed(trials, search.name, root):
        st.warning(md_escape(f"{unfollowed.capitalize()} (Start search does)."))
    shown = with_runs(trials)
    st.dataframe(shown, hide_index=True, placeholder="", column_config=TRIAL_COLUMNS)
    done = shown[shown["state"] == "completed"]
    if not done.empty:
        best = done.sort_values("value", ascending=search.spec.objective.metric == "loss")
        st.subheader("Best trials")
        st.dataframe(best.head(3), hide_index=True, placeholder="", column_config=TRIAL_COLUMNS)
        config = data.config(RunDir(root / best.iloc[0]["run_id"]))
        kept = critical_batch.stored(config, root) if config else None
        st.info(
            md_escape(kept.reading())
            if kept
            else "No critical batch is calibrated for this task here: `python -m toolkit "
            "calibrate` on the best trial's config measures one."
        )
    study = searches.study(search, root)
    for tab, name in zip(st.tabs(list(FIGURES)), FIGURES, strict=True):
        with tab:
            if (drawn := figure(name, study)) is None:
                st.caption(f"{name}: not enough completed trials to draw yet.")
            else:
                st.plotly_chart(drawn, key=f"search_{name}", theme=None)
    st.download_button("Trials (CSV)", trials.to_csv(index=False), f"{search.name}.csv", "text/csv")
    if running and not active:  # the runner finished: stop refreshing
        st.rerun()


progress()
