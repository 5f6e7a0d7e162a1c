"""The run directory, the contract between training, the launcher, the app and notebooks.

::

    runs/<run_id>/
      config.yaml    the resolved config, exactly what ran
      meta.json      run id, created time, argv, world size, versions, git commit, seed
      status.json    state (queued | running | completed | failed | stopped), pid, exit code
      events.jsonl   one JSON object per line (toolkit.events)
      stdout.log     combined output of horovodrun
      checkpoints/   model + optimizer state (toolkit.checkpoints)

JSON files are replaced atomically, so a reader never sees half of one. A run whose recorded
process is gone while its state is still ``queued`` or ``running`` is reported as ``failed``.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import psutil

from toolkit.config import RUN_NAME, ExperimentConfig, load

STATES = ("queued", "running", "completed", "failed", "stopped")
TERMINAL = ("completed", "failed", "stopped")
RUNS_ENV = "LBL_RUNS"


def runs_root(root: str | Path | None = None) -> Path:
    """``root``, else ``$LBL_RUNS``, else ``./runs``."""
    return Path(root or os.environ.get(RUNS_ENV, "runs"))


def new_run_id(name: str) -> str:
    """``<name>-<UTC time>-<4 hex>``: unique, sortable, and a valid run name."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return f"{name[:40]}-{stamp}-{secrets.token_hex(2)}"


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` atomically with ``data`` as JSON."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@dataclass(frozen=True)
class RunDir:
    """One run's directory; cheap to create, reads files on demand."""

    path: Path

    @classmethod
    def create(cls, root: str | Path | None, run_id: str) -> RunDir:
        if not RUN_NAME.match(run_id):
            raise ValueError(f"run id {run_id!r} must match {RUN_NAME.pattern}")
        path = runs_root(root) / run_id
        path.mkdir(parents=True, exist_ok=False)
        return cls(path)

    @property
    def run_id(self) -> str:
        return self.path.name

    config_path = property(lambda self: self.path / "config.yaml")
    meta_path = property(lambda self: self.path / "meta.json")
    status_path = property(lambda self: self.path / "status.json")
    events_path = property(lambda self: self.path / "events.jsonl")
    stdout_path = property(lambda self: self.path / "stdout.log")
    checkpoints_path = property(lambda self: self.path / "checkpoints")

    def write_config(self, config: ExperimentConfig) -> None:
        self.config_path.write_text(config.to_yaml())

    def config(self) -> ExperimentConfig:
        """The config the run was created with (checked then; read here without importing
        TensorFlow)."""
        return load(self.config_path, stored=True)

    def meta(self) -> dict[str, Any]:
        return read_json(self.meta_path)

    def update_meta(self, **fields) -> None:
        write_json(self.meta_path, {**self.meta(), **fields})

    def status(self) -> dict[str, Any]:
        """The recorded status, with a dead run's ``queued``/``running`` reported as failed
        (a run that has no process yet is given 30 s to start one)."""
        status = read_json(self.status_path) or {"state": "queued"}
        starting = not status.get("pid") and time.time() - status.get("updated", 0) < 30
        if (
            status.get("state") not in TERMINAL
            and not starting
            and not pid_alive(status.get("pid"))
        ):
            status = {
                **status,
                "state": "failed",
                "reason": "its processes exited without writing a final status",
            }
        return status

    def set_status(self, state: str, **fields) -> None:
        """Record ``state``, keeping earlier fields (pid, started) unless overwritten."""
        if state not in STATES:
            raise ValueError(f"state must be one of {STATES}, got {state!r}")
        previous = read_json(self.status_path)
        write_json(
            self.status_path,
            {**previous, **fields, "state": state, "updated": time.time()},
        )


def list_runs(root: str | Path | None = None) -> list[RunDir]:
    """Every run directory under the root, newest first (by when its config was written,
    which happens once, at creation)."""
    base = runs_root(root)
    if not base.is_dir():
        return []
    runs = [RunDir(p) for p in base.iterdir() if p.is_dir() and RUN_NAME.match(p.name)]
    return sorted(runs, key=_created, reverse=True)


def _created(run: RunDir) -> float:
    for path in (run.config_path, run.path):
        try:
            return path.stat().st_mtime
        except OSError:
            continue
    return 0.0


def summary(run: RunDir, events: pd.DataFrame | None = None) -> dict[str, Any]:
    """One row of the runs table: identity, state, set-up, and the headline numbers
    (``events``: the run's events if the caller has already read them)."""
    from toolkit.events import read_events

    status, meta = run.status(), run.meta()
    try:
        config = run.config()
        optimizer, workers = config.optimizer.name, config.workers
        global_batch = config.global_batch()
    except Exception:  # a half-written or hand-edited config must not break the table
        optimizer, workers, global_batch = (
            None,
            meta.get("world_size"),
            meta.get("global_batch"),
        )
    events = read_events(run.events_path) if events is None else events
    train = events[events["phase"] == "train"] if "phase" in events else events.iloc[0:0]
    evals = events[events["phase"] == "eval"] if "phase" in events else events.iloc[0:0]
    started = status.get("started") or meta.get("created")
    ended = status.get("state") in TERMINAL
    finished = status.get("finished") or (status.get("updated") if ended else time.time())

    def column(frame, name, how):
        if name not in frame or frame[name].dropna().empty:
            return None
        values = frame[name].dropna()
        return float(getattr(values, how)() if how != "last" else values.iloc[-1])

    return {
        "run_id": run.run_id,
        "state": status.get("state"),
        "optimizer": optimizer,
        "global_batch": global_batch,
        "workers": workers,
        "started": started,
        "duration_s": finished - started if started else None,
        "last_step": column(train, "step", "last"),
        "last_loss": column(train, "loss", "last"),
        "best_eval_loss": column(evals, "loss", "min"),
        "last_eval_accuracy": column(evals, "accuracy", "last"),
        "best_eval_accuracy": column(evals, "accuracy", "max"),
        "samples_per_sec": column(train, "samples_per_sec", "median"),
        "reason": status.get("reason"),
    }
