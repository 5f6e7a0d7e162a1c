"""How the dashboard's tables label a run's columns: the Runs table shows them all, and other
tables of runs (the Sweep page's cells) take theirs from here, so a column reads the same on
every page."""

import streamlit as st

RUN_COLUMNS = {
    "run_id": st.column_config.TextColumn("run", pinned=True),
    "state": st.column_config.TextColumn("state"),
    "progress": st.column_config.ProgressColumn("progress", format="percent", min_value=0),
    "epochs_done": st.column_config.TextColumn("epoch"),
    "best_eval_accuracy": st.column_config.NumberColumn("best eval acc", format="%.4f"),
    "last_eval_accuracy": st.column_config.NumberColumn("last eval acc", format="%.4f"),
    "checkpoint": st.column_config.TextColumn(
        "checkpoint", help="⚠ damaged: its newest checkpoint is; the run's reason says which"
    ),
    "samples_per_sec": st.column_config.NumberColumn("samples/s", format="%.0f"),
    "optimizer": st.column_config.TextColumn("optimizer"),
    "global_batch": st.column_config.NumberColumn("global batch", format="%d"),
    "workers": st.column_config.NumberColumn("workers", format="%d"),
    "backend": st.column_config.TextColumn("backend", help="the Keras backend its workers run"),
    "where": st.column_config.TextColumn("where"),
    "tags": st.column_config.ListColumn("tags"),
    "started": st.column_config.DatetimeColumn("started (UTC)", format="YYYY-MM-DD HH:mm:ss"),
    "duration_s": st.column_config.NumberColumn("duration (s)", format="%.0f"),
    "last_step": st.column_config.NumberColumn("last step", format="%d"),
    "last_loss": st.column_config.NumberColumn("last loss", format="%.4f"),
    "best_eval_loss": st.column_config.NumberColumn("best eval loss", format="%.4f"),
    "queue": st.column_config.NumberColumn(
        "queue", format="%d", help="place in the launch queue while it waits for slots (1: next)"
    ),
    "reason": st.column_config.TextColumn("reason"),
    "notes": st.column_config.TextColumn("notes"),
}
