"""The launch queue: every run its executor queues on these machines (this one, hosts over ssh)
waits here until its workers fit the free slots; a Slurm job waits in Slurm's queue instead.

The queue lives in the runs root, so it outlives whichever terminal, notebook or dashboard
launched a run, and leaves nothing behind when nothing waits:

- ``runs/.queue.json`` holds the runs waiting in line, each with the slots it needs, and the
  capacity if one was set; it exists only while either does.
- A run that has its slots holds them from ``launched`` until ``released`` (both in its
  ``status.json``, with ``slots``), and only while it is live or has a live process: a killed
  run never holds slots, and a run that has ended holds them until its workers have exited.
  A launch that fits when nobody waits takes its slots at once, so the file is never written.
- Every read-modify-write holds an ``flock`` on the runs root directory itself, released if
  its holder dies.

The rules:

- **Capacity.** A host has the slots :func:`capacity` gives it: those set with
  :func:`set_capacity` (``python -m toolkit queue --capacity localhost:4``), else, for
  ``localhost``, the GPU count where GPUs exist and the CPU core count otherwise. A host named
  only by a run's ``hosts`` (``h1:2,h2:2``) has the slots that run declares for it.
- **In order.** A run takes its slots only when every run queued before it has taken theirs
  and all its hosts have enough free: first come, first started (no overtaking).
- **One winner.** Taking slots is a check-then-act under the lock, so two runs can never both
  take the last slot.
- **Nothing stale.** A waiting entry whose run is gone, or has ended with no live process left,
  is dropped by the next reader.

The waiting itself is done by the run's supervisor (:mod:`toolkit.launching.supervisor`), in its own
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
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from toolkit import files, host_list
from toolkit.config import ExperimentConfig
from toolkit.launching import hosts as hosts_lib
from toolkit.runs import processes
from toolkit.runs.rundir import LIVE, RunDir, RunError, list_runs, runs_root

QUEUE_FILE = ".queue.json"
POLL_S = 0.5
"""How often a waiting supervisor looks at the queue again."""


def slots_of(config: ExperimentConfig) -> dict[str, int]:
    """The slots a run takes on each host: its ``hosts``, an elastic run's discovered hosts
    now (where it starts), or ``localhost: workers``."""
    if config.elastic is not None:
        return host_list.parse(hosts_lib.discover(config.elastic.discovery))
    return host_list.parse(config.hosts or f"localhost:{config.workers}")


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
    """Set the queue's capacity (``name:slots,...``; ``None``: back to this machine's default);
    waiting runs that now fit start on their supervisors' next look."""
    chosen = host_list.parse(hosts) if hosts else None
    with _locked(runs_root(root)) as (state, write):
        state.pop("capacity", None)
        write({**state, "capacity": chosen} if chosen else state)
    return capacity(root)


def check_fits(slots: dict[str, int], root: str | Path | None = None) -> None:
    """Raise :class:`~toolkit.runs.rundir.RunError` if a run needing ``slots`` could never start
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


def enqueue(run: RunDir, slots: dict[str, int]) -> bool:
    """Give ``run`` its slots now if nobody waits and they are free (``True``: recorded in its
    status, as a started run holds them), else put it at the end of the line (``False``)."""
    base = run.path.parent
    with _locked(base) as (state, write):
        entries = _live([e for e in state["entries"] if e["run_id"] != run.run_id], base)
        if not entries and _fits(slots, _taken(entries, base), _capacity(state)):
            run.record_processes(launched=time.time(), released=None, slots=slots)
            if state["entries"]:
                write({**state, "entries": entries})
            return True
        entry = {"run_id": run.run_id, "slots": slots, "enqueued": time.time(), "granted": None}
        write({**state, "entries": [*entries, entry]})
        return False


def try_start(run: RunDir) -> bool | None:
    """Take ``run``'s slots if it is first in line and they are free: ``True`` when granted (or
    given at :func:`enqueue`), ``False`` while it must wait, ``None`` when it is no longer in
    line (stopped, or dropped as stale). A grant stays in line, counted as taken, until
    :func:`leave_line` hands it over to the run's status."""
    base = run.path.parent
    with _locked(base) as (state, write):
        entries = _live(state["entries"], base)
        mine = next((e for e in entries if e["run_id"] == run.run_id), None)
        changed = len(entries) != len(state["entries"])
        if mine is not None and mine["granted"] is None:
            first = next(e for e in entries if e["granted"] is None)
            if first is mine and _fits(mine["slots"], _taken(entries, base), _capacity(state)):
                mine["granted"] = time.time()
                changed = True
        if changed:
            write({**state, "entries": entries})
    if mine is None:
        return True if _held_by(run) else None
    return mine["granted"] is not None


def wait_turn(run: RunDir, poll_s: float = POLL_S) -> bool:
    """Block until ``run`` has its slots (``True``) or has left the line (``False``)."""
    while (granted := try_start(run)) is False:
        time.sleep(poll_s)
    return bool(granted)


def leave_line(run: RunDir) -> None:
    """Take ``run`` out of the line: once it has started (its supervisor has recorded
    ``launched`` and ``slots`` in its status, which hold the slots from then on), or when it
    leaves without starting (stopped while queued)."""
    with _locked(run.path.parent) as (state, write):
        entries = [e for e in state["entries"] if e["run_id"] != run.run_id]
        if len(entries) != len(state["entries"]):
            write({**state, "entries": entries})


def entries(root: str | Path | None = None) -> list[dict[str, Any]]:
    """The runs holding slots (``position`` ``None``), then those waiting in line, each with
    ``run_id``, ``slots`` and ``position`` (1 is the next to start)."""
    base = runs_root(root)
    waiting = _live(_read(base)["entries"], base)
    holding = [{"run_id": r, "slots": s, "position": None} for r, s in _holding(base)]
    held = {e["run_id"] for e in holding}
    holding += [
        {**e, "position": None} for e in waiting if e["granted"] and e["run_id"] not in held
    ]
    return holding + [{**e, "position": i} for i, e in enumerate(_line(waiting), 1)]


def positions(root: str | Path | None = None) -> dict[str, int]:
    """``{run_id: position}`` of the runs waiting for slots (1 is next); reads the line only
    (nothing when no run waits), so the Runs page can ask on every render."""
    base = runs_root(root)
    return {e["run_id"]: i for i, e in enumerate(_line(_live(_read(base)["entries"], base)), 1)}


def _line(entries: list[dict]) -> list[dict]:
    """The entries still waiting for their grant, in order."""
    return [e for e in entries if e["granted"] is None]


def _fits(need: dict[str, int], taken: Counter, have: dict[str, int]) -> bool:
    return all(taken[host] + n <= have.get(host, n) for host, n in need.items())


def _taken(entries: list[dict], base: Path) -> Counter:
    """Slots in use: granted entries not yet handed over, and runs that hold theirs."""
    taken = Counter()
    for entry in entries:
        if entry["granted"] is not None:
            taken.update(entry["slots"])
    handed = {e["run_id"] for e in entries}
    for run_id, slots in _holding(base):
        if run_id not in handed:  # counted once: a grant and its hand-over may overlap
            taken.update(slots)
    return taken


def _holding(base: Path) -> Iterator[tuple[str, dict[str, int]]]:
    """``(run_id, slots)`` of the runs that hold slots through their status."""
    for run in list_runs(base):
        if held := _held_by(run):
            yield run.run_id, held


def _held_by(run: RunDir) -> dict[str, int] | None:
    """The slots ``run`` holds: taken (``launched``), not ``released``, and the run live or
    with a live process."""
    recorded = run.recorded_status()
    if "launched" not in recorded or "released" in recorded or "slots" not in recorded:
        return None
    return recorded["slots"] if _active(run) else None


def _active(run: RunDir) -> bool:
    """Whether ``run`` is queued or running, or still has a live process (a run that has ended
    keeps its slots until its workers have exited)."""
    status = run.status()  # checked against its processes
    records = run.process_records(status)
    return status["state"] in LIVE or any(processes.running(run.path, r) for r in records)


def _live(entries: list[dict], base: Path) -> list[dict]:
    """The entries whose runs still exist and are queued or running, or have a live process."""
    runs = ((e, RunDir(base / e["run_id"])) for e in entries)
    return [entry for entry, run in runs if run.path.is_dir() and _active(run)]


def _read(base: Path) -> dict[str, Any]:
    try:
        state = files.read_json(base / QUEUE_FILE)
    except (OSError, ValueError):  # none (nothing waits), or unreadable: an empty line
        return {"entries": []}
    if not isinstance(state, dict) or not isinstance(state.get("entries"), list):
        return {"entries": []}
    entries = [e for e in state["entries"] if _is_entry(e)]
    return {**state, "entries": entries}


def _is_entry(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("run_id"), str)
        and isinstance(entry.get("slots"), dict)
        and "granted" in entry
    )


@contextmanager
def _locked(base: Path) -> Iterator[tuple[dict[str, Any], Any]]:
    """The queue's state under the runs root's lock, and a function that writes it back (and
    removes the file when nothing waits and no capacity is set)."""
    with files.writing(base):
        base.mkdir(parents=True, exist_ok=True)
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield _read(base), functools.partial(_write, base)
    finally:
        os.close(fd)


def _write(base: Path, state: dict[str, Any]) -> None:
    path = base / QUEUE_FILE
    if state.get("entries") or state.get("capacity"):
        files.write_json(path, state)
    else:
        path.unlink(missing_ok=True)
