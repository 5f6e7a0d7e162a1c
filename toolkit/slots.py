"""The launch queue: every launched run waits here until its workers fit the free slots.

The queue lives in the runs root, so it outlives whichever terminal, notebook or dashboard
launched a run::

    runs/.queue.json   {"capacity": {"host": slots, ...} (optional),
                        "entries": [{"run_id", "slots": {"host": n}, "enqueued", "started"}]}
    runs/.queue.lock   the lock every read-modify-write of the queue holds (flock)

The rules:

- **Capacity.** A host has the slots :func:`capacity` gives it: those set with
  :func:`set_capacity` (``python -m toolkit queue --capacity localhost:4``), else, for
  ``localhost``, the GPU count where GPUs exist and the CPU core count otherwise. A host named
  only by a run's ``hosts`` (``h1:2,h2:2``) has the slots that run declares for it.
- **In order.** A run takes its slots only when every run queued before it has taken theirs
  and all its hosts have enough free: first come, first started (no overtaking).
- **One winner.** Taking slots is a check-then-act under the queue's ``flock``, so two runs
  can never both take the last slot; the lock is released if its holder dies.
- **Nothing stale.** An entry whose run is gone, or has ended and has no live process left
  (see :meth:`~toolkit.rundir.RunDir.status`), is dropped by the next reader, so a killed run
  never holds slots, and a run that has ended keeps them until its workers have exited.

The waiting itself is done by the run's supervisor (:mod:`toolkit.launch`), in its own
session: a queued run starts even when nothing that launched it is still running, and stopping
it ends the supervisor before it ever starts ``horovodrun``.
"""

from __future__ import annotations

import fcntl
import functools
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from toolkit import files, processes
from toolkit.config import HOSTS, ExperimentConfig
from toolkit.rundir import LIVE, RunDir, RunError, runs_root

QUEUE_FILE = ".queue.json"
LOCK_FILE = ".queue.lock"
POLL_S = 0.5
"""How often a waiting supervisor looks at the queue again."""


def parse_hosts(hosts: str) -> dict[str, int]:
    """``"h1:2,h2:2"`` as ``{"h1": 2, "h2": 2}`` (the syntax of the config's ``hosts``)."""
    if not HOSTS.match(hosts):
        raise ValueError(
            f"hosts must be name:slots[,name:slots...], e.g. h1:2,h2:2 (got {hosts!r})"
        )
    pairs = (item.rsplit(":", 1) for item in hosts.split(","))
    return {name: int(count) for name, count in pairs}


def slots_of(config: ExperimentConfig) -> dict[str, int]:
    """The slots a run takes on each host: its ``hosts``, or ``localhost: workers``."""
    return parse_hosts(config.hosts or f"localhost:{config.workers}")


@functools.cache
def local_slots() -> int:
    """This machine's slots: its GPUs where ``nvidia-smi`` lists any, else its CPU cores."""
    if nvidia := shutil.which("nvidia-smi"):
        try:
            listed = subprocess.run([nvidia, "-L"], capture_output=True, text=True, timeout=10)
            gpus = sum(line.startswith("GPU ") for line in listed.stdout.splitlines())
            if gpus:
                return gpus
        except (OSError, subprocess.SubprocessError):
            pass
    return os.cpu_count() or 1


def capacity(root: str | Path | None = None) -> dict[str, int]:
    """The slots of each host the queue manages (see the module's rules)."""
    return _capacity(_read(runs_root(root)))


def _capacity(state: dict[str, Any]) -> dict[str, int]:
    return {"localhost": local_slots(), **(state.get("capacity") or {})}


def set_capacity(hosts: str | None, root: str | Path | None = None) -> dict[str, int]:
    """Set the queue's capacity (``name:slots,...``; ``None``: back to this machine's default)
    and start whatever now fits on the next look of the waiting supervisors."""
    chosen = parse_hosts(hosts) if hosts else None
    with _locked(runs_root(root)) as (state, write):
        state.pop("capacity", None)
        if chosen:
            state["capacity"] = chosen
        write(state)
    return capacity(root)


def check_fits(slots: dict[str, int], root: str | Path | None = None) -> None:
    """Raise :class:`~toolkit.rundir.RunError` if a run needing ``slots`` could never start
    (more workers on a host than the host has slots), so it is refused instead of waiting
    forever."""
    have = capacity(root)
    for host, need in slots.items():
        if need > have.get(host, need):
            raise RunError(
                f"{need} workers on {host} can never start: the queue gives {host} "
                f"{have[host]} slots (python -m toolkit queue --capacity {host}:{need} to "
                "raise it)"
            )


def enqueue(run: RunDir, slots: dict[str, int]) -> None:
    """Put ``run`` at the end of the queue (again, if it was in it: a resume)."""
    with _locked(run.path.parent) as (state, write):
        entries = [e for e in state["entries"] if e["run_id"] != run.run_id]
        entry = {"run_id": run.run_id, "slots": slots, "enqueued": time.time(), "started": None}
        write({**state, "entries": [*entries, entry]})


def try_start(run: RunDir) -> bool | None:
    """Take ``run``'s slots if it is first in line and they are free: ``True`` when taken (or
    already held), ``False`` while it must wait, ``None`` when it is no longer queued (stopped,
    or dropped as stale)."""
    with _locked(run.path.parent) as (state, write):
        entries = _live(state["entries"], run.path.parent)
        mine = next((e for e in entries if e["run_id"] == run.run_id), None)
        taken = False
        if mine is not None and mine["started"] is None:
            first = next(e for e in entries if e["started"] is None)
            if first is mine and _fits(mine["slots"], entries, _capacity(state)):
                mine["started"] = time.time()
                taken = True
        if taken or len(entries) != len(state["entries"]):
            write({**state, "entries": entries})
    return None if mine is None else mine["started"] is not None


def wait_turn(run: RunDir, poll_s: float = POLL_S) -> bool:
    """Block until ``run`` has its slots (``True``) or has left the queue (``False``)."""
    while (started := try_start(run)) is False:
        time.sleep(poll_s)
    return bool(started)


def release(run: RunDir) -> None:
    """Give back ``run``'s slots, or its place in line."""
    with _locked(run.path.parent) as (state, write):
        entries = [e for e in state["entries"] if e["run_id"] != run.run_id]
        if len(entries) != len(state["entries"]):
            write({**state, "entries": entries})


def entries(root: str | Path | None = None) -> list[dict[str, Any]]:
    """The queue's live entries in order, each with ``position`` (1 for the next to start;
    ``None`` for a run that holds its slots)."""
    base = runs_root(root)
    if not (base / QUEUE_FILE).exists():
        return []
    live = _live(_read(base).get("entries", []), base)
    waiting = [e for e in live if e["started"] is None]
    return [{**e, "position": waiting.index(e) + 1 if e["started"] is None else None} for e in live]


def positions(root: str | Path | None = None) -> dict[str, int]:
    """``{run_id: position}`` of the runs waiting for slots (1 is next)."""
    return {e["run_id"]: e["position"] for e in entries(root) if e["position"] is not None}


def _fits(slots: dict[str, int], entries: list[dict], have: dict[str, int]) -> bool:
    for host, need in slots.items():
        busy = sum(e["slots"].get(host, 0) for e in entries if e["started"] is not None)
        if busy + need > have.get(host, need):
            return False
    return True


def _live(entries: list[dict], base: Path) -> list[dict]:
    """The entries whose runs still exist and are queued or running, or still have a live
    process (a completed run's workers may take seconds to exit: they keep its slots)."""
    kept = []
    for entry in entries:
        try:
            run = RunDir(base / entry["run_id"])
        except (KeyError, TypeError):
            continue
        if not run.path.is_dir():
            continue
        status = run.status()
        records = run.process_records(status)
        if status["state"] in LIVE or any(processes.find(record) for record in records):
            kept.append(entry)
    return kept


def _read(base: Path) -> dict[str, Any]:
    try:
        state = files.read_json(base / QUEUE_FILE)
    except (OSError, ValueError):  # none yet, or unreadable: start an empty queue
        return {"entries": []}
    if not isinstance(state, dict) or not isinstance(state.get("entries"), list):
        return {"entries": []}
    return state


@contextmanager
def _locked(base: Path) -> Iterator[tuple[dict[str, Any], Any]]:
    """The queue's state under its lock, and a function that writes it back."""
    with files.writing(base / LOCK_FILE):
        base.mkdir(parents=True, exist_ok=True)
        fd = os.open(base / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield _read(base), lambda state: files.write_json(base / QUEUE_FILE, state)
    finally:
        os.close(fd)
