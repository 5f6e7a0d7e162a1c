"""Runs: all runs in one filterable table; stop, rerun, resume or delete one; its output,
config, and a diff of two runs' configs."""

import difflib

import pandas as pd
import streamlit as st

from app import data
from app.data import md_escape
from toolkit import files, slots
from toolkit import launch as launcher
from toolkit.config import ConfigError
from toolkit.rundir import LIVE

COLUMNS = {
    "run_id": st.column_config.TextColumn("run"),
    "state": st.column_config.TextColumn("state"),
    "queue": st.column_config.NumberColumn(
        "queue", format="%d", help="place in the launch queue while it waits for slots (1: next)"
    ),
    "optimizer": st.column_config.TextColumn("optimizer"),
    "global_batch": st.column_config.NumberColumn("global batch", format="%d"),
    "workers": st.column_config.NumberColumn("workers", format="%d"),
    "started": st.column_config.DatetimeColumn("started (UTC)", format="YYYY-MM-DD HH:mm:ss"),
    "duration_s": st.column_config.NumberColumn("duration (s)", format="%.0f"),
    "last_step": st.column_config.NumberColumn("last step", format="%d"),
    "last_loss": st.column_config.NumberColumn("last loss", format="%.4f"),
    "best_eval_loss": st.column_config.NumberColumn("best eval loss", format="%.4f"),
    "last_eval_accuracy": st.column_config.NumberColumn("last eval acc", format="%.4f"),
    "best_eval_accuracy": st.column_config.NumberColumn("best eval acc", format="%.4f"),
    "samples_per_sec": st.column_config.NumberColumn("samples/s", format="%.0f"),
    "reason": st.column_config.TextColumn("reason"),
}


def act(action):
    """Run a launcher action and return its result; on error, show it and stop the page."""
    try:
        with st.spinner("Working…"):
            return action()
    except (ConfigError, ValueError, OSError) as error:
        st.error(md_escape(error))
        st.stop()


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

summaries = pd.DataFrame([data.summary(r) for r in runs])
probes = summaries["probe"].astype(bool)  # short runs of `toolkit probe`, hidden by default
if not st.toggle(f"Show noise-scale probes ({int(probes.sum())})", value=False):
    summaries = summaries[~probes]
summaries["queue"] = summaries["run_id"].map(slots.positions(data.root()))
table = summaries.reindex(columns=list(COLUMNS))
table["started"] = pd.to_datetime(table["started"], unit="s", errors="coerce")
left, middle, right = st.columns([1, 1, 2])
states = left.multiselect("State", sorted(table["state"].dropna().unique()))
optimizers = middle.multiselect("Optimizer", sorted(table["optimizer"].dropna().unique()))
search = right.text_input("Run name contains")
if states:
    table = table[table["state"].isin(states)]
if optimizers:
    table = table[table["optimizer"].isin(optimizers)]
if search:
    table = table[table["run_id"].str.contains(search, case=False, regex=False)]
st.dataframe(table, hide_index=True, column_config=COLUMNS)
if table.empty:
    st.info("No run matches the filters.")
    st.stop()

ids = list(table["run_id"])
current = st.session_state.get("current_run")
run_id = st.selectbox("Selected run", ids, index=ids.index(current) if current in ids else 0)
st.session_state.current_run = run_id
run = data.find(run_id)
if run is None:  # deleted since the listing
    st.rerun()
status = run.status()
state = status.get("state")
st.text(f"state: {state}" + (f"  ({status['reason']})" if status.get("reason") else ""))

stop, rerun, resume, delete = st.columns(4)
if stop.button("Stop", disabled=state not in LIVE, width="stretch"):
    act(lambda: launcher.stop(run_id, data.root(), by="the app"))
    done(f"Stopped {run_id}.")
config = data.config(run)
if rerun.button("Rerun with the same config", disabled=config is None, width="stretch"):
    new = act(lambda: launcher.launch(config, runs_root_dir=data.root()))
    st.session_state.current_run = new.run_id
    done(f"Started {new.run_id} with the config of {run_id}.")
if resume.button("Resume", disabled=state not in ("stopped", "failed"), width="stretch"):
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

output, resolved, diff = st.tabs(["stdout.log (end)", "Config", "Config diff"])
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
