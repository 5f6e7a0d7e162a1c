"""Reading run directories for the dashboard, cached on each file's (size, mtime).

Every reader here takes the file's stamp as part of its cache key (``st.cache_data``, or
``st.cache_resource`` for event frames, shared uncopied), so an unchanged file is parsed once
per server process and a changed one (a live run appending events) is re-read on the next
render. Nothing here raises on a half-written, crashed or malformed run directory: missing or
unreadable files read as empty (never through a symlink, see ``toolkit.files``), unreadable
configs as ``None``.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import pandas as pd
import streamlit as st

from toolkit import config as config_lib
from toolkit import files, safe_yaml
from toolkit.runs import checkpoints, rundir, table
from toolkit.runs.events import EventTail, read_events
from toolkit.runs.rundir import RunDir
from toolkit.runs.theme import COLORS


def root() -> Path:
    """The runs root: ``$LBL_RUNS`` or ``./runs``."""
    return rundir.runs_root()


@st.cache_data(max_entries=20, show_spinner="Working out each cell's steps…")
def sweep_plan(sweep_yaml: str) -> pd.DataFrame:
    """A sweep's :func:`~toolkit.launching.sweep_runner.dry_run` under the runs root, by its
    resolved YAML (the Sweep page's and the Launch page's calibration grid)."""
    from toolkit.launching import sweep, sweep_runner

    grid = sweep.from_mapping(safe_yaml.load(sweep_yaml, "sweep"))
    return sweep_runner.dry_run(grid, root())


def stamp(path: Path) -> tuple[int, int]:
    """``(size, mtime_ns)`` of ``path``; ``(-1, -1)`` when it does not exist."""
    try:
        stat = path.stat()
    except OSError:
        return (-1, -1)
    return (stat.st_size, stat.st_mtime_ns)


def runs() -> list[RunDir]:
    """All runs under the root, newest first (a directory listing, so not cached)."""
    try:
        return rundir.list_runs(root())
    except OSError:  # a run deleted while listing
        return []


def color(run: RunDir) -> str:
    """The run's colour, the same on every chart of every page, at every reload, whatever is
    created or deleted meanwhile: the palette's entry at the ``number`` its status recorded
    when it was made (:meth:`~toolkit.runs.rundir.RunDir.create`: consecutive runs differ), or
    for a run made before runs were numbered, at a hash of its id. Reads that run's status
    only."""
    number = run.recorded_status().get("number")
    number = number if isinstance(number, int) else zlib.crc32(run.run_id.encode())
    return COLORS[number % len(COLORS)]


def config_columns(selected: list[RunDir]) -> pd.DataFrame:
    """Every config field of each run as a column (``optimizer.params.momentum``, by
    :meth:`~toolkit.config.ExperimentConfig.flat`), indexed by run id; a run without a readable
    config has empty cells."""
    rows = {run.run_id: loaded.flat() for run in selected if (loaded := config(run)) is not None}
    return pd.DataFrame.from_dict(rows, orient="index")


def find(run_id: str | None) -> RunDir | None:
    return next((r for r in runs() if r.run_id == run_id), None)


@st.cache_resource(max_entries=200, show_spinner=False)
def _events(path: str, file_stamp: tuple[int, int]) -> pd.DataFrame:
    return read_events(path)  # an OSError is not cached: a broken file is retried


def events(run: RunDir) -> pd.DataFrame:
    """All complete event records of ``run`` (a torn last line is skipped; an unreadable
    file, a directory or a symlink in its place, reads as none: the Runs table says why).

    The frame is shared by every session and rerun, not copied (copying 100 runs of 50,000
    events in and out of a cache cost 0.4 s of a render): callers must not modify it."""
    try:
        return _events(str(run.events_path), stamp(run.events_path))
    except OSError:
        return pd.DataFrame()


@st.cache_resource(max_entries=200, show_spinner=False)
def _phases(path: str, file_stamp: tuple[int, int]) -> dict[str, pd.DataFrame]:
    frame = _events(path, file_stamp)
    if "phase" not in frame:
        return {}
    groups = frame.groupby("phase", sort=False)
    return {name: rows.dropna(axis=1, how="all") for name, rows in groups}


def phases(run: RunDir) -> dict[str, pd.DataFrame]:
    """The run's events split by phase, each without its all-empty columns (see :func:`phase`).

    Built once per file stamp and shared, like :func:`events`: callers must not modify the
    frames."""
    try:
        return _phases(str(run.events_path), stamp(run.events_path))
    except OSError:
        return {}


def phase(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    """The rows of one phase (``train``, ``eval``, ``trust_ratio``), without all-empty columns."""
    if "phase" not in frame:
        return frame.iloc[0:0]
    return frame[frame["phase"] == name].dropna(axis=1, how="all")


@st.cache_data(max_entries=2000, show_spinner=False)
def _summary(path: str, stamps: tuple, state: str) -> dict:
    run = RunDir(Path(path))
    try:  # the cached events; an unreadable file is left to summary, which names the problem
        frame = _events(str(run.events_path), stamps[-1])
    except OSError:
        frame = None
    return table.summary(run, frame)


def summary(run: RunDir) -> dict:
    """``toolkit.runs.table.summary(run)``, re-computed when any of the run's files, its
    checkpoints directory or its liveness (a dead process reads as failed) changes."""
    paths = (run.status_path, run.config_path, run.meta_path, run.checkpoints_path)
    paths += (run.events_path,)  # last: _summary reads its stamp
    return _summary(str(run.path), tuple(map(stamp, paths)), run.status().get("state"))


@st.cache_data(max_entries=500, show_spinner=False)
def _damaged_checkpoint(path: str, stamps: tuple) -> str | None:
    return checkpoints.damaged_latest(Path(path))


def damaged_checkpoint(run: RunDir) -> str | None:
    """:func:`toolkit.runs.checkpoints.damaged_latest` for ``run``, checksums included,
    re-checked when a checkpoint file changes (its size or mtime)."""
    found = sorted(run.checkpoints_path.glob("epoch-*/*"))
    return _damaged_checkpoint(str(run.checkpoints_path), tuple((str(p), stamp(p)) for p in found))


@st.cache_data(max_entries=1000, show_spinner=False)
def _config(path: str, file_stamp: tuple[int, int]) -> config_lib.ExperimentConfig | None:
    try:
        return RunDir(Path(path)).config()
    except (config_lib.ConfigError, OSError):
        return None


def config(run: RunDir) -> config_lib.ExperimentConfig | None:
    """The run's validated config, or ``None`` if it is missing or does not validate."""
    return _config(str(run.path), stamp(run.config_path))


def text(path: Path) -> str:
    """A text file's content ('' if missing or unreadable), undecodable bytes replaced."""
    try:
        return files.read_bytes(path).decode("utf-8", errors="replace")
    except OSError:
        return ""


@st.cache_data(max_entries=20, show_spinner=False)
def _events_csv(paths: tuple[str, ...], stamps: tuple) -> bytes:
    frames = [events(RunDir(Path(p))).assign(run_id=Path(p).name) for p in paths]
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if "run_id" in frame:
        frame = frame[["run_id", *(c for c in frame.columns if c != "run_id")]]
    return frame.to_csv(index=False).encode()


def events_csv(selected: list[RunDir]) -> bytes:
    """One CSV of the runs' events, with a leading ``run_id`` column."""
    paths = tuple(str(r.path) for r in selected)
    return _events_csv(paths, tuple(stamp(r.events_path) for r in selected))


def md_escape(text: str) -> str:
    """``text`` as literal Markdown: every ASCII punctuation character backslash-escaped, so
    user strings shown by ``st.error``/``st.success`` cannot become links, HTML or directives."""
    return "".join(
        "\\" + c if c.isascii() and not c.isalnum() and not c.isspace() else c for c in str(text)
    )


def live_events(run: RunDir) -> pd.DataFrame:
    """The run's events, reading only the bytes appended since this session's last call: an
    :class:`~toolkit.runs.events.EventTail` and the rows so far are kept in ``st.session_state``
    (for the run shown last only, so a long session does not hoard every run it opened)."""
    key = str(run.path)
    kept = st.session_state.get("event_tails", {}).get(key)
    tail, frame = kept or (EventTail(run.events_path), pd.DataFrame())
    try:
        new = tail.read_new()
    except OSError:  # not a regular file: nothing to show
        return pd.DataFrame()
    if tail.restarted or frame.empty:
        frame = new
    elif not new.empty:
        frame = pd.concat([frame, new], ignore_index=True)
    st.session_state.event_tails = {key: (tail, frame)}
    return frame
