"""Where a run runs, as its status records it, for readers.

The executor that starts a run (:mod:`toolkit.launching.executors`) writes into its status
``executor`` (its kind), ``where`` (in words: ``this machine``, ``hosts a:2, b:2``,
``Slurm job 12``) and ``launcher`` (the program whose exit ends the run). Readers ask here and
never which executor it was: the runs table's "where", the supervisor's failure reading, and
:func:`live_state`, the state of a run whose jobs a scheduler keeps (:data:`SCHEDULERS`: the
status field its job id is in, and how to read the job). A status written before executors
reads as it did.
"""

from __future__ import annotations

from collections.abc import Callable

from toolkit.runs import slurm_jobs

SCHEDULERS: dict[str, Callable[[dict], dict | None]] = {
    "slurm_job_id": slurm_jobs.live_state,
}
"""A status field holding a scheduler's job id -> the live status as that scheduler tells it
(``None``: it no longer knows the job, the run's own processes tell). Slurm's is here for every
reader; an executor registered beside the built-in ones adds its own
(:func:`toolkit.launching.executors.registry.register`)."""


def live_state(status: dict) -> dict | None:
    """``status`` as the scheduler that holds the run's job tells it; ``None`` if no scheduler
    holds it (or it no longer knows the job)."""
    for field, read in SCHEDULERS.items():
        if status.get(field):
            return read(status)
    return None


def where(status: dict) -> str:
    """Where the run ran, in words: as its executor recorded it (a status written before
    executors: a Slurm job by its id, else the hosts its processes ran on)."""
    if status.get("where"):
        return status["where"]
    if status.get("slurm_job_id"):
        return f"Slurm job {status['slurm_job_id']}"
    hosts = sorted({entry["host"] for entry in status.get("processes", []) if entry.get("host")})
    return f"hosts {', '.join(hosts)}" if len(hosts) > 1 else "this machine"


def executor(status: dict) -> str:
    """The kind of executor the run went to (a status written before executors: Slurm's if it
    has a job id, else this machine's)."""
    if status.get("executor"):
        return status["executor"]
    return "slurm" if status.get("slurm_job_id") else "local"


def launcher(status: dict) -> str:
    """The program whose exit ended the run, as failure reading names it."""
    if status.get("launcher"):
        return status["launcher"]
    return "srun" if status.get("slurm_job_id") else "horovodrun"
