"""Runs: all runs in one table that refreshes while any is live, filtered by state, optimizer,
tag or text, with any config field as a column to sort, filter or group by; and for the selected
run: stop, rerun, resume or delete, its tags and notes, its output, config and a config diff."""

import difflib
import time
from urllib.parse import quote

import pandas as pd
import streamlit as st

from app import data
from app.actions import act
from app.columns import RUN_COLUMNS
from app.data import md_escape
from toolkit import files
from toolkit.launching import launch as launcher
from toolkit.launching import slots
from toolkit.runs.rundir import LIVE
from toolkit.runs.states import RESUMABLE
from toolkit.runs.table import matches, progress_text, reason_now

REFRESH_S = 2.0
# The table's columns, in the order a researcher reads them: what, how far, how well, how fast.
GROUP_COLUMNS = {  # the grouped table: its columns, as (column, aggregation) of the runs table
    "runs": ("run_id", "size"),
    "mean best eval acc": ("best_eval_accuracy", "mean"),
    "std best eval acc": ("best_eval_accuracy", "std"),
    "max best eval acc": ("best_eval_accuracy", "max"),
    "median samples/s": ("samples_per_sec", "median"),
}
GROUPED = {
    name: RUN_COLUMNS[column].copy() | {"label": name}
    for name, (column, how) in GROUP_COLUMNS.items()
    if how != "size"
}
LINKED = {  # the run's id drawn as a link to its Run detail, in the place of its plain text
    **RUN_COLUMNS,
    "run_id": None,
    "open": st.column_config.LinkColumn(
        "run", display_text=r"run=(.+)$", help="open the run's Run detail (a new tab)", pinned=True
    ),
}


def labels(run) -> None:
    """The run's tags and notes, edited in place (stored in its ``meta.json``)."""
    left, right = st.columns([1, 2])
    kept = run.tags()
    chosen = left.multiselect(
        "Tags",
        sorted(set(kept) | set(known_tags)),
        default=kept,
        accept_new_options=True,
        key=f"tags-{run.run_id}",
    )
    notes = right.text_area("Notes", run.notes(), height=68, key=f"notes-{run.run_id}")
    if chosen != kept:
        act(lambda: run.set_tags(add=chosen, remove=set(kept) - set(chosen)))
        done(f"Tagged {run.run_id}: {', '.join(sorted(chosen)) or 'no tags'}.")
    if notes != run.notes():
        act(lambda: run.set_notes(notes))
        done(f"Saved the notes of {run.run_id}.")


def done(message: str) -> None:
    st.session_state.flash = message
    st.rerun()


st.title("Runs")
if flash := st.session_state.pop("flash", None):
    st.success(md_escape(flash))
runs = data.runs()
if not runs:
    st.info("No runs yet. Start one on the Launch page.")
    st.stop()


def summaries(runs: list) -> pd.DataFrame:
    """One row per run (:func:`toolkit.runs.table.summary`), with its place in the launch queue,
    its progress as text and a mark where its newest checkpoint is damaged."""
    rows = [data.summary(r) for r in runs]
    frame = pd.DataFrame(rows)
    frame["epochs_done"] = [progress_text(row) for row in rows]
    now = time.time()
    frame["reason"] = [reason_now(row, now) for row in rows]  # a silent run's said too
    damaged = frame["damaged_checkpoint"].fillna("").astype(bool)  # None reads NaN: truthy
    frame["checkpoint"] = damaged.map({True: "⚠ damaged", False: ""})
    frame["queue"] = frame["run_id"].map(slots.positions(data.root()))
    frame["started"] = pd.to_datetime(frame["started"], unit="s", errors="coerce")
    return frame


every = summaries(runs)
probes = every["probe"].astype(bool)  # short runs of `toolkit probe`, hidden by default
show_probes = st.toggle(f"Show noise-scale probes ({int(probes.sum())})", value=False)
known_tags = sorted({tag for tags in every["tags"] for tag in tags})
left, middle, right, far = st.columns([1, 1, 1, 2])
states = left.multiselect("State", sorted(every["state"].dropna().unique()))
optimizers = middle.multiselect("Optimizer", sorted(every["optimizer"].dropna().unique()))
tags = right.multiselect("With tags", known_tags, help="runs that carry all of these tags")
search = far.text_input("Search", placeholder="run name, tag or note")
configs = data.config_columns(runs)
left, middle, right = st.columns([2, 1, 1])
fields = left.multiselect(
    "Config columns",
    list(configs.columns),
    help="any config field as a column: sort by clicking its header, filter or group by it",
)
where = middle.selectbox("Filter by", [None, *fields])
allowed = []
if where:
    values = sorted(configs[where].dropna().astype(str).unique())
    allowed = middle.multiselect(f"{where} is", values, placeholder="any value")
group = right.selectbox("Group by", [None, "state", "optimizer", "tags", *fields])


def shown(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows the filters keep, with the chosen config fields as columns."""
    rows = frame.to_dict("records")
    keep = frame["probe"].eq(False) | show_probes
    if states:
        keep &= frame["state"].isin(states)
    if optimizers:
        keep &= frame["optimizer"].isin(optimizers)
    labelled = [set(tags) <= set(row["tags"]) and matches(row, search) for row in rows]
    keep &= pd.Series(labelled, index=frame.index, dtype=bool)
    table = frame[keep].reindex(columns=list(RUN_COLUMNS))
    table = table.join(configs[fields], on="run_id") if fields else table
    table = table[table[where].astype(str).isin(allowed)] if allowed else table
    # the chosen fields beside the run, in view, not past the table's right edge
    return table[["run_id", *fields, *table.columns.drop(["run_id", *fields])]]


def opened(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with an ``open`` column, a link to each run's Run detail, drawn first (pinned)
    as the run's id."""
    return table.assign(open="detail?run=" + table["run_id"].map(lambda r: quote(r, safe="")))


def grouped(table: pd.DataFrame) -> pd.DataFrame:
    """Runs per value of ``group`` (a run with several tags counts in each, a run with none in
    ``(untagged)``; runs without the value in ``(none)``), with the spread of their best
    accuracy and their median throughput."""
    rows = table.explode("tags") if group == "tags" else table
    missing = "(untagged)" if group == "tags" else "(none)"
    rows = rows.assign(**{group: rows[group].astype(object).where(rows[group].notna(), missing)})
    return rows.groupby(group, dropna=False).agg(**GROUP_COLUMNS).reset_index()


live = bool(every["state"].isin(LIVE).any())


@st.fragment(run_every=REFRESH_S if live else None)
def table_view() -> None:
    """The table (and the grouped one), redrawn every few seconds while a run is live."""
    frame = summaries(data.runs()) if live else every
    if live and not frame["state"].isin(LIVE).any():
        st.rerun()  # the last live run just ended: once more, without the timer
    table = shown(frame)
    st.dataframe(opened(table), hide_index=True, column_config=LINKED, placeholder="")
    if group and not table.empty:
        st.caption(f"Grouped by {group}")
        st.dataframe(grouped(table), hide_index=True, column_config=GROUPED, placeholder="")
    st.session_state.listed = list(table["run_id"])


table_view()
ids = st.session_state.get("listed", [])
if not ids:
    st.info("No run matches the filters.")
    st.stop()

if st.session_state.get("runs_run") not in ids:  # on arrival: the run chosen elsewhere
    current = st.session_state.get("current_run")
    st.session_state.runs_run = current if current in ids else ids[0]
run_id = st.selectbox("Selected run", ids, key="runs_run")
st.session_state.current_run = run_id
run = data.find(run_id)
if run is None:  # deleted since the listing
    st.rerun()
status = run.status()
state = status.get("state")
st.text(f"state: {state}" + (f"  ({status['reason']})" if status.get("reason") else ""))
if state not in LIVE and (damaged := data.damaged_checkpoint(run)):
    st.warning(md_escape(damaged))
labels(run)

stop, rerun, resume, delete = st.columns(4)
if stop.button("Stop", disabled=state not in LIVE, width="stretch"):
    act(lambda: launcher.stop(run_id, data.root(), by="the app"))
    done(f"Stopped {run_id}.")
config = data.config(run)
if rerun.button("Rerun with the same config", disabled=config is None, width="stretch"):
    new = act(lambda: launcher.launch(config, runs_root_dir=data.root()))
    st.session_state.current_run = new.run_id
    del st.session_state.runs_run  # select the new run on the next draw
    done(f"Started {new.run_id} with the config of {run_id}.")
if resume.button("Resume", disabled=state not in RESUMABLE, width="stretch"):
    act(lambda: launcher.resume(run_id, data.root()))
    done(f"Resumed {run_id}.")
if delete.button("Delete…", disabled=state in LIVE, width="stretch"):
    st.session_state.confirm_delete = run_id
if st.session_state.get("confirm_delete") == run_id:
    st.warning("Delete this run directory and everything in it? This cannot be undone.")
    st.code(str(run.path), language=None)
    yes, no = st.columns(2)
    if yes.button("Yes, delete it", type="primary", width="stretch"):
        del st.session_state.confirm_delete
        act(lambda: launcher.delete(run_id, data.root()))
        done(f"Deleted {run_id}.")
    if no.button("Cancel", width="stretch"):
        del st.session_state.confirm_delete
        st.rerun()

output, resolved, diff, tracked = st.tabs(["stdout.log (end)", "Config", "Config diff", "MLflow"])
with output:
    st.code(files.tail(run.stdout_path) or "(no output yet)", language=None)
with resolved:
    st.code(data.text(run.config_path) or "(no config.yaml)", language="yaml")
    st.json(run.meta(), expanded=False)
with diff:
    others = [r.run_id for r in runs if r.run_id != run_id] or [run_id]
    other = st.selectbox("Compare with", others)
    mine = data.text(run.config_path).splitlines(keepends=True)
    theirs = data.text(run.path.parent / other / "config.yaml").splitlines(keepends=True)
    lines = difflib.unified_diff(mine, theirs, f"{run_id}/config.yaml", f"{other}/config.yaml")
    st.code("".join(lines) or "(the configs are identical)", language="diff")
with tracked:
    st.caption(
        "Each run becomes one MLflow run: its config as params, its events as metric histories, "
        "its tags and notes, config.yaml, meta.json and its checkpoint's manifest. Exporting "
        "again adds only what is new."
    )
    uri_box, experiment_box = st.columns(2)
    uri = uri_box.text_input(
        "Tracking URI", placeholder="default: .mlflow/mlflow.db under the runs root"
    ).strip()
    experiment = experiment_box.text_input(
        "Experiment", placeholder="default: the config's name"
    ).strip()
    one, listed = st.columns(2)
    chosen = [run] if one.button("Export this run", width="stretch") else []
    if listed.button(f"Export the {len(ids)} listed runs", width="stretch"):
        chosen = [found for found in map(data.find, ids) if found is not None]
    if chosen:
        from toolkit.runs import mlflow_export  # MLflow's import (a second or two): on demand

        root = data.root()
        said = act(lambda: mlflow_export.export_runs(chosen, uri or None, experiment or None, root))
        st.success(md_escape("\n\n".join(said)))
