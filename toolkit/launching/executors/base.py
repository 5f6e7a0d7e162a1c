"""The interface every place a run can go implements: an :class:`Executor`.

An executor submits a run (:meth:`Executor.start`), checks beforehand that the run can go there
(:meth:`Executor.check`), ends it (:meth:`Executor.end`) and, where a scheduler runs sweeps
itself, submits a sweep's runs at once (:meth:`Executor.start_all`). What readers need to know of
where a run went it writes into the run's status when it queues the run (:meth:`Executor.queued`):
its ``executor`` (its kind), ``where`` (in words) and ``launcher`` (the program whose exit ends
the run), which :mod:`toolkit.runs.placement` reads back: so the runs table, the supervisor's
failure reading and the app never ask which executor ran a run.

An executor's state is its config's: one is made per request, by
:func:`toolkit.launching.executors.registry.choose`. A new place to run is one module with a
subclass and one line in :data:`toolkit.launching.executors.registry.EXECUTORS`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

from toolkit.config import ExperimentConfig
from toolkit.runs.rundir import RunDir
from toolkit.runs.states import State

Cells = list[tuple[ExperimentConfig, str, dict]]
"""A sweep's runs to start: each a validated config, its run id and its meta."""


class Executor(ABC):
    """One place a run can go (see the module's docstring)."""

    kind: ClassVar[str]
    """Its name in the registry and in a run's status (``executor``)."""
    launcher: ClassVar[str] = "horovodrun"
    """The program whose exit ends a run here, as failure reading names it."""
    queues_here: ClassVar[bool] = True
    """Its runs wait for this machine's slots (:mod:`toolkit.launching.slots`)."""
    starts_sweeps_at_once: ClassVar[bool] = False
    """A sweep's runs all go to it at once (:meth:`start_all`), its own queue pacing them."""

    @classmethod
    @abstractmethod
    def chosen_by(cls, config: ExperimentConfig) -> bool:
        """Whether ``config`` asks for this place (the registry asks each in turn)."""

    @abstractmethod
    def check(self, config: ExperimentConfig, root: Path) -> None:
        """Raise :class:`~toolkit.config.ConfigError` or :class:`OSError` if ``config``'s run
        cannot go here (pre-flight), before anything is created under the runs root ``root``."""

    @abstractmethod
    def start(self, run: RunDir, config: ExperimentConfig, resume: bool, meta: dict) -> None:
        """Start ``run`` (created, locked by the caller) or, with ``resume``, start it again from
        its latest checkpoint; record it :meth:`queued`. Raises :class:`OSError` if it cannot."""

    @abstractmethod
    def end(self, run: RunDir, status: dict, timeout: float) -> list[str]:
        """End the live run ``run`` (its ``status`` read under the caller's lock), giving its
        processes ``timeout`` s before killing them; what survived, in words (none: all ended)."""

    @abstractmethod
    def where(self, config: ExperimentConfig, job: str | None = None) -> str:
        """Where a run of ``config`` goes, in words (``job``: its scheduler's id, if any)."""

    def start_all(self, cells: Cells, name: str, root: Path, max_parallel: int | None):
        """Start a sweep's ``cells`` at once as sweep ``name`` under ``root``, at most
        ``max_parallel`` running at a time; their runs. Only for :attr:`starts_sweeps_at_once`."""
        raise NotImplementedError(f"the {self.kind} executor starts a sweep's runs one by one")

    def queued(self, run: RunDir, config: ExperimentConfig, job: str | None = None, **fields):
        """Record ``run`` queued here afresh: where it goes, and nothing left of a previous
        attempt (a resume's): no stop asked, no exit, reason, end or processes; and ``fields``."""
        run.set_status(
            State.QUEUED,
            executor=self.kind,
            where=self.where(config, job),
            launcher=self.launcher,
            stop_requested=False,
            stop_as=None,
            exit_code=None,
            reason=None,
            finished=None,
            pid=None,
            processes=[],
            **fields,
        )

    @staticmethod
    def record_launch(run: RunDir, config: ExperimentConfig, command: list[str], meta: dict):
        """What ``meta.json`` says of a launch (or a resume): when, the command that started
        it, its world size and seed, and ``meta``."""
        run.update_meta(
            run_id=run.run_id,
            created=time.time(),
            command=command,
            world_size=config.workers,
            seed=config.seed,
            **meta,
        )
