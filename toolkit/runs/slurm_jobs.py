"""What Slurm says of the lab's jobs, read once for all of them and kept a few seconds.

The dashboard reads every run every 2 s, and ``runs`` every run at once: one ``squeue`` answers
for all of them (:func:`jobs`), cached for :data:`CACHE_S` seconds, never one call per run.
Without ``slurmdbd`` (the test cluster) a finished job stays in ``squeue -t all`` for
``MinJobAge`` seconds; after that the run's own record (the job writes its end into the run
directory) and its processes' heartbeats say how it ended.

:func:`lab_state` maps Slurm's job states to the lab's: ``PENDING`` (and a requeued job's
``REQUEUED``) is ``queued``; ``RUNNING``, ``CONFIGURING`` and ``COMPLETING`` are ``running``;
``COMPLETED``, ``FAILED``, ``NODE_FAIL``, ``OUT_OF_MEMORY``, ``TIMEOUT``, ``PREEMPTED``,
``BOOT_FAIL`` and ``DEADLINE`` are ``failed`` when the run did not record its own end (a
completed job whose training did not say so ended early); ``CANCELLED`` is ``stopped``. The
reason always carries Slurm's own words.
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass

from toolkit.runs.states import State

CACHE_S = 3.0
QUEUED = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED")
RUNNING = ("RUNNING", "CONFIGURING", "COMPLETING", "RESIZING", "SIGNALING", "STAGE_OUT")


@dataclass(frozen=True)
class Job:
    """One job as ``squeue`` lists it: its id, Slurm state and reason (``None`` if none)."""

    job_id: str
    state: str
    reason: str | None


_lock = threading.Lock()
_cache: tuple[float, dict[str, Job] | None] = (-float("inf"), None)


def jobs() -> dict[str, Job] | None:
    """Every job of this user's that ``squeue`` knows of, pending, running or recently ended,
    by id (an array's tasks as ``123_4``); ``None`` if Slurm does not answer. Cached for
    :data:`CACHE_S` s."""
    global _cache
    with _lock:
        read_at, cached = _cache
        if time.monotonic() - read_at < CACHE_S:
            return cached
        _cache = (time.monotonic(), _squeue())
        return _cache[1]


def job(job_id: str) -> Job | None:
    """The job ``job_id`` (``None``: Slurm does not answer, or no longer knows it)."""
    listed = jobs()
    return None if listed is None else listed.get(str(job_id))


def answers() -> bool:
    """Whether ``squeue`` answers (through the cache)."""
    return jobs() is not None


def forget() -> None:
    """Drop the cache: the next read asks Slurm (after a submit or a cancel)."""
    global _cache
    with _lock:
        _cache = (-float("inf"), None)


def wait_ended(job_id: str, timeout: float) -> bool:
    """Wait up to ``timeout`` s until ``job_id`` is neither pending nor running; whether it
    ended."""
    deadline = time.monotonic() + timeout
    while True:
        forget()
        found = job(job_id)
        if found is None or found.state not in QUEUED + RUNNING:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)


def lab_state(job: Job) -> tuple[str, str]:
    """The lab's state for ``job`` and a reason in Slurm's words."""
    said = f"Slurm job {job.job_id} {job.state}" + (f" ({job.reason})" if job.reason else "")
    if job.state in QUEUED:
        return State.QUEUED, said
    if job.state in RUNNING:
        return State.RUNNING, said
    if job.state == "CANCELLED":
        return State.STOPPED, said
    return State.FAILED, said


def live_state(status: dict) -> dict | None:
    """A live run's ``status`` as Slurm knows its job (``slurm_job_id``): queued while pending,
    starting once the job runs until its workers train, and ended with Slurm's words if the job
    ended without the run recording it; as recorded if Slurm is out of reach; ``None`` if Slurm
    no longer knows the job (the run's processes tell)."""
    found = job(status["slurm_job_id"])
    if found is None:
        return None if answers() else status
    state, said = lab_state(found)
    if state == State.RUNNING:  # the run says whether it is training yet
        return status if status["state"] != State.QUEUED else {**status, "state": State.STARTING}
    if state != State.QUEUED:
        said = f"{said}; the run did not record its end: see stdout.log"
    return {**status, "state": state, "reason": said}


def _squeue() -> dict[str, Job] | None:
    try:
        answer = subprocess.run(
            ["squeue", "--me", "-h", "-r", "-t", "all", "-o", "%i|%T|%r"],
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if answer.returncode != 0:
        return None
    found = {}
    for line in answer.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            reason = None if parts[2] in ("None", "") else parts[2]
            found[parts[0]] = Job(parts[0], parts[1], reason)
    return found
