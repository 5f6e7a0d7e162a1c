"""The processes of a run, recorded so that its state can be read from what is actually alive.

A record is ``{"role": ..., "pid": ..., "started": ..., "host": ...}`` (a worker's also has its
``rank``): ``started`` is the process's creation time, so a pid reused by an unrelated process
after the run's died is not mistaken for it. A run records its supervisor, its ``horovodrun``
and every training worker (the workers run in sessions of their own, outside the supervisor's
process group, so killing that group would miss them). An elastic run replaces its worker
records with the new world's at each reset, so a departed worker is no longer looked for.

A worker that horovodrun did not start (training in a notebook's kernel, or any process that
called ``train`` itself) is recorded in the role ``in-process``: ``stop`` never signals it, or
anything it started, and it ends itself at its next check of the status instead.

A process on this host is checked with the process table. One on another host is judged by its
**heartbeat**: the supervisor and every worker touch ``<run>/.heartbeats/<host>-<pid>`` every
:data:`HEARTBEAT_S` seconds (:class:`Heartbeat`), and a heartbeat older than
:data:`HEARTBEAT_STALE_S` is a dead process. Heartbeats, not an ssh per look, because the
readers are the dashboard and ``runs``, which look at every run on every render and must stay
a file read: an ssh per run would take seconds, hang with a dead host, and needs keys a reader
of a shared runs root may not have. (Judged this way, host clocks must agree to a few seconds,
as NTP keeps them.) Signalling a remote process does go over ssh: :func:`terminate_on`, which
runs :func:`terminate_records` there.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

HEARTBEATS = ".heartbeats"
HEARTBEAT_S = 5.0
HEARTBEAT_STALE_S = 20.0


IN_PROCESS = "in-process"
SPARED = ("supervisor", IN_PROCESS)  # stop leaves them to end by themselves


def record(role: str, pid: int | None = None) -> dict[str, Any]:
    """The record of process ``pid`` (default: this one) in ``role``."""
    process = psutil.Process(pid)
    return {
        "role": role,
        "pid": process.pid,
        "started": process.create_time(),
        "host": socket.gethostname(),
    }


def is_local(entry: dict[str, Any]) -> bool:
    return entry.get("host", socket.gethostname()) == socket.gethostname()


def find(entry: dict[str, Any]) -> psutil.Process | None:
    """The live, local process ``entry`` records, or ``None`` if it is gone (or was replaced by
    another process with the same pid). A record without ``started`` matches by pid alone."""
    if not is_local(entry):
        return None
    try:
        process = psutil.Process(entry["pid"])
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        started = entry.get("started")
        if started is not None and abs(process.create_time() - started) > 0.05:
            return None
        return process
    except (psutil.Error, KeyError, TypeError, ValueError):
        return None


def alive(entries: list[dict[str, Any]]) -> list[psutil.Process]:
    """The live local processes among ``entries`` and all their descendants, each once."""
    found: dict[int, psutil.Process] = {}
    for entry in entries:
        process = find(entry)
        if process is None:
            continue
        found.setdefault(process.pid, process)
        try:
            for child in process.children(recursive=True):
                found.setdefault(child.pid, child)
        except psutil.Error:
            continue
    return list(found.values())


def running(run_path: Path, entry: dict[str, Any]) -> bool:
    """Whether ``entry``'s process lives: by the process table on this host, by its heartbeat
    in ``run_path`` on another."""
    if is_local(entry):
        return find(entry) is not None
    try:
        beat = (heartbeat_path(run_path, entry)).stat().st_mtime
    except (OSError, KeyError, TypeError):
        return False
    return time.time() - beat < HEARTBEAT_STALE_S and beat >= entry.get("started", 0) - 1


def heartbeat_path(run_path: Path, entry: dict[str, Any]) -> Path:
    return Path(run_path) / HEARTBEATS / f"{entry['host']}-{int(entry['pid'])}"


class Heartbeat(threading.Thread):
    """Touches the heartbeat of ``entry`` (this process's record) in ``run_path`` now and every
    :data:`HEARTBEAT_S` seconds (a daemon thread) until :meth:`stop`, which removes it."""

    def __init__(self, run_path: Path, entry: dict[str, Any]):
        super().__init__(name="heartbeat", daemon=True)
        self.path = heartbeat_path(run_path, entry)
        self._stopped = threading.Event()
        self._beat()

    def run(self) -> None:
        while not self._stopped.wait(HEARTBEAT_S):
            self._beat()

    def stop(self) -> None:
        self._stopped.set()
        self.path.unlink(missing_ok=True)

    def _beat(self) -> None:
        try:
            self.path.parent.mkdir(exist_ok=True)
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644))
            os.utime(self.path)
        except OSError:  # a run directory gone or unwritable: readers will call it dead
            pass


def terminate_records(
    entries: list[dict[str, Any]], timeout: float, spare: tuple[str, ...] = SPARED
) -> list[psutil.Process]:
    """End the live local processes of ``entries`` and their descendants (:func:`terminate`),
    except those whose role is in ``spare`` and this process; the descendants of a process in
    the role ``in-process``, or of this one, are never looked for. Returns the survivors."""

    def mine(entry: dict[str, Any]) -> bool:
        return entry.get("role") == IN_PROCESS or entry.get("pid") == os.getpid()

    spared = {p.pid for e in entries if e.get("role") in spare and (p := find(e))}
    targets = [e for e in entries if not mine(e)]
    return terminate([p for p in alive(targets) if p.pid not in spared | {os.getpid()}], timeout)


def terminate_on(host: str, entries: list[dict[str, Any]], timeout: float, ssh) -> list[int]:
    """:func:`terminate_records` run on ``host`` over ``ssh`` (a
    :class:`toolkit.launching.remote.Ssh`); returns the surviving pids. Raises :class:`OSError` if
    ``host`` cannot be reached."""
    args = ["-m", "toolkit.runs.processes", "terminate", "--timeout", str(timeout)]
    answer = ssh.python(host, args, stdin=json.dumps(entries), timeout_s=timeout + 60)
    try:
        return json.loads(answer.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        said = (answer.stderr.strip().splitlines() or ["no answer"])[-1][:300]
        raise OSError(f"cannot reach {host} to end its processes: {said}") from None


def terminate(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """SIGTERM ``processes``, SIGKILL those still alive after ``timeout`` s; return the ones that
    survived even that."""
    for process in processes:
        _send(process.terminate)
    _, alive_after = psutil.wait_procs(processes, timeout=timeout)
    for process in alive_after:
        _send(process.kill)
    _, survivors = psutil.wait_procs(alive_after, timeout=5)
    return survivors


def _send(signal_it) -> None:
    try:
        signal_it()
    except psutil.Error:
        pass


if __name__ == "__main__":  # on another host, for terminate_on: records on stdin
    parser = argparse.ArgumentParser(prog="python -m toolkit.runs.processes")
    parser.add_argument("command", choices=["terminate"])
    parser.add_argument("--timeout", type=float, required=True)
    args = parser.parse_args()
    mine = [e for e in json.load(sys.stdin) if is_local(e)]
    print(json.dumps([p.pid for p in terminate_records(mine, args.timeout)]))
