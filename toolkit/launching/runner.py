"""One runner for every set of runs: a sweep's cells, a search's trials, a calibration's grid.

A set (:class:`RunSet`, its policy) says what to run next, what its runs' progress means while
they train and what each run's end means; :func:`run` owns the rest, once for every kind:

- **the loop**: launch (:func:`toolkit.launching.launch.launch`, so by the executor each config
  chooses) while fewer than ``max_parallel`` runs are in flight and the set has one to start;
  every ``poll_s`` settle each run in flight (:func:`~toolkit.launching.launch.settle`), show the
  set the runs in flight, and hand it each run that has ended;
- **capacity**: ``max_parallel`` defaults to as many runs as the launch queue's slots hold
  (:func:`default_parallel`), or all of them where their executor paces them itself (Slurm's
  queue); runs known up front whose executor starts a set's runs together (Slurm's job
  arrays, :attr:`~toolkit.launching.executors.base.Executor.starts_sweeps_at_once`) are handed
  to it at once;
- **the lock**: one runner per set and runs root (:mod:`toolkit.launching.runner_lock`);
  :func:`start` runs one in a process of its own session, refused while one is alive;
- **retries**, by one rule (:func:`retry`);
- **resumption after a kill**: a set resumes by looking, not by remembering (its runs'
  directories, a search's study), and hands the runner the runs an earlier runner left in
  flight (:meth:`RunSet.recover`); nothing is launched twice.
"""

from __future__ import annotations

import abc
import dataclasses
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from toolkit import files
from toolkit.config import ConfigError, ExperimentConfig
from toolkit.launching import launch, remote, runner_lock
from toolkit.launching.executors import registry
from toolkit.launching.slots import capacity, check_fits, slots_of
from toolkit.runs import checkpoints, placement
from toolkit.runs.events import diverged, read_events
from toolkit.runs.rundir import LIVE, RunDir, RunError
from toolkit.runs.states import State
from toolkit.words import counted

POLL_S = 1.0
RESUME, RERUN = "resume", "rerun"
ATTEMPT = "attempt"
"""In a run's ``meta.json``: its attempt (1, then one more for each resume or relaunch)."""


@dataclasses.dataclass(frozen=True)
class Planned:
    """A run a set wants launched: its config, the run id it asks for (it gets the first free
    one, :func:`free_id`: a later attempt's is ``<id>-2``...), its ``meta`` and ``tags``, its
    ``label`` in the runner's log, and ``item``, the set's own handle on it (a cell, a trial)."""

    config: ExperimentConfig
    run_id: str
    meta: dict[str, Any]
    label: str
    item: Any = None
    tags: tuple[str, ...] = ()


@dataclasses.dataclass
class Flight:
    """A run in flight: what was planned, its run directory, its attempt (1, then one more for
    each resume or relaunch) and its status at the last poll."""

    planned: Planned
    run: RunDir
    attempt: int = 1
    status: dict = dataclasses.field(default_factory=dict)

    @property
    def state(self) -> str:
        return self.status.get("state", State.QUEUED)


class RunSet(abc.ABC):
    """A policy over the runner: a kind of set of runs (see the module docstring)."""

    kind: str
    """``sweep``, ``search``: the set's word in messages."""
    error: type[ConfigError]
    """What the set raises, naming what is wrong."""
    name: str
    base: Path
    """The runs root its runs go to."""
    folder: Path
    """Where the set's lock and log are kept (``<name>.lock``, ``<name>.log``)."""
    retries: int
    """How many times :func:`retry` gives a failed run another attempt."""

    @abc.abstractmethod
    def configs(self) -> list[ExperimentConfig]:
        """The configs its runs train (one for all of a search's), for capacity and pacing."""

    @abc.abstractmethod
    def size(self) -> int:
        """How many runs it wants in all (a search's trials times its seeds)."""

    def check(self) -> None:
        """Raise :attr:`error` naming what could not run, before anything starts."""
        return None

    @abc.abstractmethod
    def save(self) -> Path:
        """Keep the set's resolved file in the runs root (for the dashboard and reruns); its
        path."""

    @abc.abstractmethod
    def recover(self, log: Callable[[str], None]) -> list[Flight]:
        """The runs an earlier runner left in flight, adopted (saying what it found)."""

    def at_once(self) -> list[Planned]:
        """Runs known up front whose executor starts a set's runs together (default none)."""
        return []

    @abc.abstractmethod
    def next(self) -> Planned | None:
        """The next run to launch; ``None`` when none is wanted now."""

    def launching(self, planned: Planned, run_id: str, attempt: int) -> None:
        """Told before ``planned`` is launched as ``run_id`` (a search records it: a runner that
        dies before the run exists leaves that known)."""
        return None

    def launched(self, flight: Flight) -> None:
        """Told once ``flight``'s run has been launched."""
        return None

    def not_launched(self, planned: Planned, error: Exception) -> None:
        """``planned`` could not launch (its values cannot run here); default: raise."""
        raise error

    def watch(self, flights: list[Flight]) -> None:
        """Shown the runs in flight at each poll, settled (a search reports and prunes)."""
        return None

    def resumed(self, flight: Flight) -> None:
        """Told when :func:`retry` resumed ``flight``'s failed run (its attempt counted)."""
        return None

    @abc.abstractmethod
    def ended(self, flight: Flight, reason: str) -> None:
        """``flight``'s run has ended and gets no further attempt (``reason``: its status's)."""

    @abc.abstractmethod
    def relaunch(self, flight: Flight, reason: str) -> None:
        """``flight``'s run failed and :func:`retry` gives it a fresh attempt: queue it."""

    @abc.abstractmethod
    def progress(self, word: str, in_flight: int, limit: int) -> str | None:
        """A line on how the set stands (``word``: starting, going on, done), or none."""


def retry(flight: Flight, retries: int) -> str | None:
    """The one retry rule: a run that **failed** (not one stopped, pruned or completed) on its
    attempt ``retries`` or earlier is resumed from its latest intact checkpoint
    (:data:`RESUME`), or with none relaunched from the start as a new run beside it
    (:data:`RERUN`), unless it diverged (a train event logged a NaN or infinite loss: its
    rerun would diverge again, the divergence is its result); else ``None``."""
    if flight.state != State.FAILED or flight.attempt > retries:
        return None
    try:
        if diverged(read_events(flight.run.events_path)):
            return None
    except OSError:
        pass
    intact, _ = checkpoints.latest_intact(flight.run.checkpoints_path)
    return RESUME if intact is not None else RERUN


def run(
    runset: RunSet,
    *,
    max_parallel: int | None = None,
    log: Callable[[str], None] = print,
    poll_s: float = POLL_S,
) -> None:
    """Run ``runset`` until it wants nothing more and nothing is in flight, ``max_parallel``
    runs at a time (default :func:`default_parallel`). Safe to call again after an
    interruption; a second runner of the same set raises the set's error while one is alive."""
    check_parallel(max_parallel, runset.error)
    runset.check()
    limit = max_parallel or default_parallel(runset.configs(), runset.size(), runset.base)
    with runner_lock.held(runset.folder / f"{runset.name}.lock", runset.error(_busy(runset))):
        runset.save()
        _Loop(runset, limit, log).run(poll_s, max_parallel)


def default_parallel(configs: list[ExperimentConfig], size: int, root: Path | None = None) -> int:
    """How many runs of a set go at once by default: as many as fit the launch queue's slots
    (at least 1), or all ``size`` of them where no config waits in this machine's queue (its
    executor's queue paces them)."""
    here = [config for config in configs if registry.choose(config).queues_here]
    if not here:
        return max(1, size)
    have = capacity(root)
    fits = [
        min(have.get(host, need) // need for host, need in slots_of(config).items())
        for config in here
    ]
    return max(1, min(fits))


def check_fits_here(config: ExperimentConfig, root: Path | None = None) -> None:
    """Raise :class:`~toolkit.runs.rundir.RunError` if ``config``'s run waits in this machine's
    launch queue and needs more slots than it gives (one its executor queues elsewhere is that
    queue's to pace): what every set checks of each run before any starts."""
    if registry.choose(config).queues_here:
        check_fits(slots_of(config), root)


def check_parallel(max_parallel: int | None, error: type[ConfigError]) -> None:
    """Raise ``error`` unless ``max_parallel`` is ``None`` (the default) or an integer >= 1."""
    if max_parallel is not None and (
        isinstance(max_parallel, bool) or not isinstance(max_parallel, int) or max_parallel < 1
    ):
        raise error(f"max_parallel must be an integer >= 1 (got {max_parallel!r})")


class _Loop:
    """One runner's pass over a set (see the module docstring)."""

    def __init__(self, runset: RunSet, limit: int, log: Callable[[str], None]):
        self.set, self.base, self.limit, self.log = runset, runset.base, limit, log
        self.in_flight: list[Flight] = []

    def run(self, poll_s: float, max_parallel: int | None) -> None:
        self.in_flight = self.set.recover(self.log)
        self._say(self.set.progress("starting", len(self.in_flight), self.limit))
        self._launch_at_once(max_parallel)
        while True:
            self._follow()
            while len(self.in_flight) < self.limit and (planned := self.set.next()):
                self._launch(planned)
            if not self.in_flight:
                break
            time.sleep(poll_s)
        self._say(self.set.progress("done", 0, self.limit))

    def _say(self, line: str | None) -> None:
        if line:
            self.log(line)

    def _launch_at_once(self, max_parallel: int | None) -> None:
        planned = self.set.at_once()
        if not planned:
            return
        cells = [(p.config, free_id(p.run_id, self.base), p.meta) for p in planned]
        runs = launch.launch_all(cells, self.set.name, self.base, max_parallel)
        for flight in [Flight(p, r) for p, r in zip(planned, runs, strict=True)]:
            self.in_flight.append(flight)
            self.set.launched(flight)
        where = placement.where(runs[0].status())
        self.log(f"submitted {counted(len(runs), 'run')} at once ({where}...)")

    def _launch(self, planned: Planned) -> None:
        attempt = planned.meta.get(ATTEMPT, 1)
        run_id = free_id(planned.run_id, self.base)
        self.set.launching(planned, run_id, attempt)
        try:
            run = launch.launch(
                planned.config,
                runs_root_dir=self.base,
                run_id=run_id,
                meta={**planned.meta, ATTEMPT: attempt},
                tags=list(planned.tags),
            )
        except (ConfigError, RunError, OSError) as error:
            self.set.not_launched(planned, error)
            return
        flight = Flight(planned, run, attempt)
        self.in_flight.append(flight)
        self.set.launched(flight)

    def _follow(self) -> None:
        """Settle every run in flight, show them to the set, then deal with those that ended."""
        for flight in self.in_flight:
            flight.status = launch.settle(flight.run)
        self.set.watch(self.in_flight)  # a set that ends a run records its status in its flight
        for flight in [f for f in self.in_flight if f.state not in LIVE]:
            self.in_flight.remove(flight)
            reason = flight.status.get("reason") or "no reason recorded"
            then = retry(flight, self.set.retries)
            if then == RESUME:
                self._resume(flight, reason)
            elif then == RERUN:
                self.set.relaunch(flight, reason)
            else:
                self.set.ended(flight, reason)

    def _resume(self, flight: Flight, reason: str) -> None:
        intact, _ = checkpoints.latest_intact(flight.run.checkpoints_path)
        try:
            launch.resume(flight.run, self.base)
        except (RunError, ConfigError, OSError) as error:  # then from the start
            self.set.relaunch(flight, f"{reason}; could not resume: {error}")
            return
        flight.attempt += 1
        flight.run.update_meta(**{ATTEMPT: flight.attempt})
        self.in_flight.append(flight)
        self.set.resumed(flight)
        self.log(
            f"{flight.planned.label}: failed ({reason}); resumed from its checkpoint "
            f"{intact.name} (attempt {flight.attempt} of {self.set.retries + 1})"
        )


def _busy(runset: RunSet) -> str:
    return f"{runset.kind} {runset.name!r} is already being run by another process"


def active(folder: Path, name: str) -> bool:
    """Whether a runner of the set ``name`` kept in ``folder`` is alive (it holds its lock)."""
    return runner_lock.is_held(folder / f"{name}.lock")


def start(runset: RunSet, flags: list[str]) -> int:
    """Run ``runset`` in a process of its own session (``python -m toolkit --runs ROOT KIND
    FILE FLAGS``: its kind's command on its saved file), output appended to the set's log; its
    pid. Raises the set's error, before anything is written, while a runner of it is alive."""
    if active(runset.folder, runset.name):
        raise runset.error(_busy(runset))
    command = [sys.executable, "-m", "toolkit", "--runs", str(runset.base), runset.kind]
    command += [str(runset.save()), *flags]
    return detached(command, runset.folder / f"{runset.name}.log")


def detached(command: list[str], log_path: Path) -> int:
    """Start ``command`` in a session of its own (it outlives the app or notebook that starts
    it), from the package's folder, its output appended to ``log_path``; return its pid."""
    with files.writing(log_path), open(log_path, "ab") as log:
        runner = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=remote.PACKAGE_ROOT,
        )
    return runner.pid


def free_id(run_id: str, base: Path) -> str:
    """``run_id``, or ``run_id-2``, ``-3``... for a rerun beside an earlier attempt."""
    attempt, candidate = 1, run_id
    while (base / candidate).exists():
        attempt += 1
        candidate = f"{run_id[: 64 - len(str(attempt)) - 1]}-{attempt}"
    return candidate
