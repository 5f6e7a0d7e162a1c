"""The interface every place a run can go implements: an :class:`Executor`.

An executor submits a run (:meth:`Executor.start`), checks beforehand that the run can go there
(:meth:`Executor.check`), ends it (:meth:`Executor.end`) and, where a scheduler runs sweeps
itself, submits a sweep's runs at once (:meth:`Executor.start_all`). What readers need to know of
where a run went it writes into the run's status when it queues the run (:meth:`Executor.queued`):
its ``executor`` (its kind), ``where`` (in words) and ``launcher`` (the program whose exit ends
the run), which :mod:`toolkit.runs.placement` reads back: so the runs table, the supervisor's
failure reading and the app never ask which executor ran a run.

An executor also brings its own doors, which the CLI, the app, sweeps and searches iterate the
registry for and never name: its :attr:`~Executor.title` where people choose a place, the
config :attr:`~Executor.section` that asks for it (set on a run, a sweep's cells or a search's
trials by :func:`over`), its CLI flags (:meth:`~Executor.add_arguments`, read back by
:meth:`~Executor.fields`) and its reading of its own words in a failed run's log
(:meth:`~Executor.failure`).

An executor's state is its config's: one is made per request, by
:func:`toolkit.launching.executors.registry.choose`. A new place to run is one module with a
subclass and one line, :func:`toolkit.launching.executors.registry.register`.
"""

from __future__ import annotations

import argparse
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel

from toolkit.config import ExperimentConfig
from toolkit.launching import failures
from toolkit.launching.failures import Failure
from toolkit.runs.rundir import RunDir
from toolkit.runs.states import State

Cells = list[tuple[ExperimentConfig, str, dict]]
"""A sweep's runs to start: each a validated config, its run id and its meta."""


class Executor(ABC):
    """One place a run can go (see the module's docstring)."""

    def __init_subclass__(cls, **kwargs):
        """A place's reading of its own words is known to failure reading once it is defined."""
        super().__init_subclass__(**kwargs)
        if "kind" in vars(cls):
            failures.READINGS[cls.kind] = cls.failure

    kind: ClassVar[str]
    """Its name in the registry and in a run's status (``executor``)."""
    title: ClassVar[str]
    """Its name where people choose a place (the Launch and Sweep pages' "Where")."""
    section: ClassVar[str | None] = None
    """The config section that asks for it, if any (``slurm``)."""
    section_model: ClassVar[type[BaseModel] | None] = None
    """That section's schema, for a place registered beside the built-in ones (a config gives
    it at its top level, read by ``config.section(name)``; Slurm's is a field of its own)."""
    job_field: ClassVar[str | None] = None
    """Where a scheduler keeps its runs' jobs: the status field holding a run's job id, read by
    :meth:`live_state` (registered in :data:`toolkit.runs.placement.SCHEDULERS`)."""
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

    @staticmethod
    def live_state(status: dict) -> dict | None:
        """``status`` as this place's scheduler tells it (a queued job's reason, a job that
        ended without its run knowing); ``None``: it no longer knows the job."""
        return None

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Its flags on the CLI's ``launch``, ``sweep`` and ``search`` (default none)."""
        return None

    @classmethod
    def fields(cls, args: argparse.Namespace) -> dict | None:
        """The fields of its :attr:`section` that its flags give; ``None``: not asked for."""
        return None

    @classmethod
    def flags(cls, fields: dict) -> list[str]:
        """The CLI flags that give ``fields`` of its :attr:`section` (what :meth:`fields` reads
        back): a runner started in the background is told the place this way."""
        raise NotImplementedError(f"the {cls.kind} executor takes no flags")

    @staticmethod
    def failure(run: RunDir, status: dict, tail: str) -> Failure | None:
        """Why a run here failed, where its launcher's output says so in this place's own words
        (``tail``: the end of the run's log); ``None``: the common readings apply."""
        return None

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


def over(raw: dict, section: str, fields: dict | bool) -> dict:
    """The config mapping ``raw`` with its ``section`` given the fields ``fields`` (over the
    section's own; ``True``: the section as it is, or empty): how a place is asked for on a run,
    a sweep's cells or a search's trials."""
    given = fields if isinstance(fields, dict) else {}
    return {**raw, section: {**(raw.get(section) or {}), **given}}
