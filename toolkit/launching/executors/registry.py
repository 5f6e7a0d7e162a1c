"""The places a run can go, and which one a run goes to.

:func:`choose` asks each of :data:`EXECUTORS` in turn whether a config asks for it (a ``slurm``
section: Slurm; other hosts or an elastic section: hosts over ssh; else this machine), once per
request; :func:`of_run` finds the one a run went to by what its status records. Every door
(launch, resume, stop, sweeps, searches) asks here, and the CLI and the app take each place's
flags and title from here (:func:`add_arguments`, :func:`asked`, :func:`titled`); readers of a
run's place (its words, its live state in a scheduler) ask :mod:`toolkit.runs.placement`.

A place beyond these is one module with an :class:`~toolkit.launching.executors.base.Executor`
and one line, ``registry.register(ItsExecutor)``, loaded as a plugin (:mod:`toolkit.plugins`:
the modules named in ``LBL_EXECUTORS``) when a process first imports this one, so the CLI, the
app and every run's supervisor started with it know the place.
"""

from __future__ import annotations

import argparse

from toolkit import plugins
from toolkit.config import ExperimentConfig
from toolkit.launching.executors.base import Executor
from toolkit.launching.executors.hosts import HostsExecutor
from toolkit.launching.executors.local import LocalExecutor
from toolkit.launching.executors.slurm import SlurmExecutor
from toolkit.runs import placement
from toolkit.runs.rundir import RunDir

EXECUTORS: list[type[Executor]] = [SlurmExecutor, HostsExecutor, LocalExecutor]
"""In the order :func:`choose` asks them; the last says yes to any config."""

Place = tuple[str, dict]
"""A place asked for: the config section that asks for it and the fields given for it."""


def register(executor: type[Executor]) -> None:
    """Add a place to run, asked before those registered earlier (its module's one line), and
    its scheduler's reader of a run's live state for every reader of runs."""
    if executor not in EXECUTORS:
        EXECUTORS.insert(0, executor)
    if executor.job_field:
        placement.SCHEDULERS[executor.job_field] = executor.live_state
    if executor.section_model is not None:
        plugins.SECTIONS[executor.section] = executor.section_model


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every place's CLI flags on ``parser`` (``launch``, ``sweep``, ``search``)."""
    for executor in EXECUTORS:
        executor.add_arguments(parser)


def asked(args: argparse.Namespace) -> Place | None:
    """The place the CLI's flags ask for (``None``: the one the config chooses); two places
    asked at once are refused, naming them."""
    places = [(e, fields) for e in EXECUTORS if (fields := e.fields(args)) is not None]
    if len(places) > 1:
        named = " and ".join(executor.title for executor, _ in places)
        raise ValueError(f"a run goes to one place: the flags ask for {named}")
    return (places[0][0].section, places[0][1]) if places else None


def titled(title: str) -> type[Executor]:
    """The executor whose :attr:`~toolkit.launching.executors.base.Executor.title` is
    ``title``."""
    return next(executor for executor in EXECUTORS if executor.title == title)


def with_section(section: str) -> type[Executor]:
    """The executor that config section ``section`` asks for."""
    return next(executor for executor in EXECUTORS if executor.section == section)


plugins.load()  # each module it names registers its executor
