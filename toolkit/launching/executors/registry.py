"""The places a run can go, and which one a run goes to.

:func:`choose` asks each of :data:`EXECUTORS` in turn whether a config asks for it (a ``slurm``
section: Slurm; other hosts or an elastic section: hosts over ssh; else this machine), once per
request; :func:`of_run` finds the one a run went to by what its status records. Every door
(launch, resume, stop, sweeps, searches) asks here; readers of a run's place (its words, its
live state in a scheduler) ask :mod:`toolkit.runs.placement`.
"""

from __future__ import annotations

from toolkit.config import ExperimentConfig
from toolkit.launching.executors.base import Executor
from toolkit.launching.executors.hosts import HostsExecutor
from toolkit.launching.executors.local import LocalExecutor
from toolkit.launching.executors.slurm import SlurmExecutor
from toolkit.runs.rundir import RunDir

EXECUTORS: list[type[Executor]] = [SlurmExecutor, HostsExecutor, LocalExecutor]
"""In the order :func:`choose` asks them; the last says yes to any config."""


def choose(config: ExperimentConfig) -> Executor:
    """The executor ``config``'s run goes to: the first of :data:`EXECUTORS` it asks for."""
    return next(executor for executor in EXECUTORS if executor.chosen_by(config))()


def of_run(run: RunDir, status: dict) -> Executor:
    """The executor ``run`` went to, by its ``status`` (one written before executors, or by
    an executor no longer registered: the one its config chooses; this machine's if its config
    cannot be read)."""
    recorded = {executor.kind: executor for executor in EXECUTORS}.get(status.get("executor"))
    if recorded:
        return recorded()
    try:
        return choose(run.config())
    except (ValueError, OSError):  # ConfigError
        return LocalExecutor()
