"""The processes of a run, recorded so that its state can be read from what is actually alive.

A record is ``{"role": ..., "pid": ..., "started": ..., "host": ...}``: ``started`` is the
process's creation time, so a pid reused by an unrelated process after the run's died is not
mistaken for it. A run records its supervisor, its ``horovodrun`` and every training worker
(the workers run in sessions of their own, outside the supervisor's process group, so killing
that group would miss them). Records from another host can be neither checked nor signalled from
here: they count as unknown, never as alive or dead.
"""

from __future__ import annotations

import socket
from typing import Any

import psutil


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
