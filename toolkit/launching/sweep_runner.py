"""Running a sweep (:mod:`toolkit.launching.sweep`) as a set of runs of
:mod:`toolkit.launching.runner` (:class:`SweepSet`): every cell that has not completed, at most
``max_parallel`` at a time; or, for cells whose executor starts a sweep's runs at once (Slurm's
job arrays, whose ``%max_parallel`` Slurm enforces), all at once.

A sweep resumes by looking, not by remembering: :func:`run` skips completed cells, waits for
cells already queued or running (launched by an earlier runner that was killed), reports failed
or stopped ones (and reruns them, as a new attempt beside the old run, with ``retry_failed``),
and launches the rest. Before anything starts, :func:`dry_run` plans every cell
(:class:`~toolkit.plan.RunPlan`) and :func:`estimate` prices it from measured throughputs.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from toolkit import advice, safe_yaml
from toolkit.config import ConfigError, ExperimentConfig, from_mapping
from toolkit.launching import runner
from toolkit.launching.executors import registry
from toolkit.launching.executors.base import over
from toolkit.launching.executors.slurm import SlurmExecutor
from toolkit.launching.slots import positions
from toolkit.launching.sweep import (
    SWEEPS_DIR,
    Cell,
    Sweep,
    SweepError,
    cell_problem,
    load,
    refuse,
    save,
)
from toolkit.launching.sweep_results import cell_runs, results
from toolkit.plan import RunPlan, Scale
from toolkit.runs.rundir import LIVE, RunDir, list_runs, runs_root
from toolkit.runs.states import State
from toolkit.runs.table import summary
from toolkit.words import counted

POLL_S = runner.POLL_S
STARTUP_S = 12.6
"""A launch's seconds from its slots to its workers' training where no run here recorded
one: ``experiments/bench_startup.py``'s median launch to first event (docs/notes/performance.md)."""


def dry_run(sweep: Sweep, root: str | Path | None = None) -> pd.DataFrame:
    """One row per cell: coordinates, run id, workers, global batch, scaled rate, total steps
    (per worker) and updates (with AdaScale, the most it can take: as many updates as its
    base run, at a gain of 1); :func:`toolkit.advice.warn` warns of what the cells' configs
    do that their author cannot want. Raises :class:`SweepError` naming every cell that could not
    launch: a batch larger than its workers' shards of the dataset, or more workers than the
    launch queue's slots (of the runs root ``root``)."""
    rows, problems = [], []
    for cell in sweep.cells:
        c = cell.config
        try:
            plan = RunPlan.of(c, c.dataset.train_examples())
            advice.warn(c)  # each finding once (Python shows a warning once per text)
            runner.check_fits_here(c, root)
        except (ValueError, RuntimeError) as error:  # ConfigError, RunError
            problems.append(cell_problem(cell.coordinates, error))
            continue
        rows.append(
            {
                **cell.coordinates,
                "run_id": cell.run_id,
                "workers": c.workers,
                "global_batch": plan.global_batch,
                "scaled_lr": plan.learning_rate,
                "total_steps": plan.total_steps,
                "updates": plan.total_updates,
            }
        )
    refuse(sweep.name, problems)
    return pd.DataFrame(rows)


def throughputs(root: str | Path | None = None, summarize=summary) -> dict[tuple, float]:
    """The median samples/s of the completed runs under ``root``, by what sets a run's speed on
    this machine: dataset, model, workers and per-worker batch (``summarize``: the dashboard
    passes its cached :func:`~toolkit.runs.table.summary`)."""
    measured = collections.defaultdict(list)
    for run in list_runs(root):
        row = summarize(run)
        if row["state"] != State.COMPLETED or not row["samples_per_sec"]:
            continue
        try:
            measured[_speed_key(run.config())].append(row["samples_per_sec"])
        except (OSError, ConfigError):
            continue
    return {key: float(pd.Series(rates).median()) for key, rates in measured.items()}


def startup(root: str | Path | None = None) -> float | None:
    """The median seconds from a run's taking its slots to its workers' training (importing
    TensorFlow, meeting over Gloo) over the completed runs under ``root``; ``None`` if none
    recorded both."""
    waits = []
    for run in list_runs(root):
        status = run.recorded_status()
        launched, started = status.get("launched"), status.get("started")
        if status.get("state") == State.COMPLETED and launched and started:
            waits.append(max(0.0, started - launched))
    return float(pd.Series(waits).median()) if waits else None


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Each cell's ``seconds`` and how its training was priced (``basis``): ``measured`` (by
    runs like it), ``nearest`` (by runs of its dataset and model at other workers or batch per
    worker: rougher) or ``start-up`` (nothing of its dataset and model measured here: its
    seconds are only its start-up)."""

    seconds: pd.Series
    basis: pd.Series


def estimate(
    sweep: Sweep, plan: pd.DataFrame, rates: dict[tuple, float], startup_s: float | None = None
) -> Estimate:
    """Each cell's time: its start-up (``startup_s``, :func:`startup`'s measure; ``None``:
    :data:`STARTUP_S`), then its training (its :func:`dry_run` row's updates x global batch)
    at the samples/s of :func:`throughputs` for its own key, else for the nearest measured key
    of its dataset and model (the fewest doublings away in workers and batch per worker)."""
    keys = [_speed_key(cell.config) for cell in sweep.cells]
    found = [_nearest(key, rates) for key in keys]
    basis = pd.Series([b for b, _ in found], index=plan.index)
    rate = pd.Series([r for _, r in found], index=plan.index)
    training = (plan["updates"] * plan["global_batch"] / rate).fillna(0.0)
    return Estimate(_startup_or_default(startup_s) + training, basis)


def _nearest(key: tuple, rates: dict[tuple, float]) -> tuple[str, float]:
    """``(basis, samples/s)`` for a cell's speed ``key`` (:class:`Estimate`)."""
    if key in rates:
        return "measured", rates[key]
    dataset, model, workers, per_worker = key
    alike = [k for k in rates if k[:2] == (dataset, model)]
    if not alike:
        return "start-up", math.nan

    def doublings(other: tuple) -> float:
        return abs(math.log2(other[2] / workers)) + abs(math.log2(other[3] / per_worker))

    return "nearest", rates[min(alike, key=doublings)]


def _startup_or_default(startup_s: float | None) -> float:
    return STARTUP_S if startup_s is None else startup_s


def cost(estimated: Estimate, plan: pd.DataFrame, parallel: int, startup_s: float | None) -> str:
    """What an :class:`Estimate` comes to with ``parallel`` cells at a time, in words: always a
    total, and how its cells were priced (those priced by their start-up alone named); the
    Sweep page and ``sweep --dry-run`` say the same."""
    basis = estimated.basis
    total = duration(estimated.seconds.sum() / parallel)
    said = f"estimated time: {total} for {counted(len(plan), 'cell')}, {parallel} at a time"
    where = "measured here" if startup_s is not None else "no run here measured one"
    said += f"; each cell counts {_startup_or_default(startup_s):.0f} s of start-up ({where})"
    if nearest := int((basis == "nearest").sum()):
        said += (
            f"; {nearest} of {len(plan)} priced from the nearest runs measured here of the same "
            "dataset and model (other workers or batch per worker: rougher)"
        )
    if missing := list(plan.loc[basis == "start-up", "run_id"]):
        said += (
            f"; {len(missing)} of {len(plan)} cells have no completed run of their dataset and "
            f"model here: their start-up alone is counted, their training is not priced: "
            f"{safe_yaml.listed(missing)}"
        )
    return said


def duration(seconds: float) -> str:
    """``2 h 05 min``, ``4 min``, ``40 s``."""
    minutes, hours = round(seconds / 60), seconds / 3600
    if hours >= 1:
        return f"{int(hours)} h {minutes % 60:02d} min"
    return f"{minutes} min" if minutes else f"{seconds:.0f} s"


def _speed_key(config: ExperimentConfig) -> tuple:
    model = json.dumps([config.model.name, config.model.params], sort_keys=True)
    return (config.dataset.name, model, config.workers, Scale.of(config).per_worker)


def states(sweep: Sweep, root: str | Path | None = None) -> pd.DataFrame:
    """Each cell's coordinates, run id and state (``pending`` before it is launched), and its
    place in the launch queue while it waits."""
    runs, waiting = cell_runs(sweep, root), positions(root)
    rows = []
    for cell in sweep.cells:
        run = runs.get(cell.key)
        rows.append(
            {
                **cell.coordinates,
                "run_id": run.run_id if run else cell.run_id,
                "state": run.status()["state"] if run else "pending",
                "queue_position": waiting.get(run.run_id) if run else None,
            }
        )
    return pd.DataFrame(rows)


def placed(sweep: Sweep, place: registry.Place | None) -> Sweep:
    """``sweep`` with every cell's config given ``place``'s section and fields
    (:func:`~toolkit.launching.executors.base.over`; ``None``: unchanged). A cell keeps its
    key, and so its identity: a cell completed on this machine is not run again on Slurm."""
    if place is None:
        return sweep
    cells = []
    for cell in sweep.cells:
        raw = over(cell.config.model_dump(mode="json"), *place)
        cells.append(dataclasses.replace(cell, config=from_mapping(raw)))
    return dataclasses.replace(sweep, cells=tuple(cells))


def on_slurm(sweep: Sweep, slurm: dict | None) -> Sweep:
    """:func:`placed` on Slurm with the ``slurm`` section's fields ``slurm``."""
    return placed(sweep, None if slurm is None else (SlurmExecutor.section, slurm))


def default_parallel(sweep: Sweep, root: str | Path | None = None) -> int:
    """How many cells go at once by default (:func:`toolkit.launching.runner.default_parallel`)."""
    configs = [cell.config for cell in sweep.cells]
    return runner.default_parallel(configs, len(configs), runs_root(root))


class SweepSet(runner.RunSet):
    """A sweep as a set of runs: its cells not completed, in order (see the module docstring).
    A failed cell is given :func:`~toolkit.launching.runner.retry`'s attempts while this
    runner follows it (the sweep file's ``retries``: none by default, since a sweep's cells
    are measurements whose failures are among its results, where a search's trials are samples
    whose failures only spend its budget); one that ended before this runner started is
    reported, and with ``retry_failed`` launched again as a new attempt beside the old run."""

    kind, error = "sweep", SweepError

    def __init__(
        self,
        sweep: Sweep,
        base: Path,
        retry_failed: bool = False,
        label: Callable[[Cell], str] | None = None,
        log: Callable[[str], None] = print,
    ):
        self.sweep, self.base, self.name = sweep, base, sweep.name
        self.folder = base / SWEEPS_DIR
        self.retry_failed, self.retries = retry_failed, sweep.spec.retries
        self.label, self.log = label or _label, log
        self.todo: list[runner.Planned] = []
        self.total, self.done = len(sweep.cells), 0

    def configs(self):
        return [cell.config for cell in self.sweep.cells]

    def size(self) -> int:
        return self.total

    def check(self) -> None:
        dry_run(self.sweep, self.base)  # every cell can launch, before any does

    def save(self) -> Path:
        return save(self.sweep, self.base)

    def _planned(self, cell: Cell, attempt: int = 1) -> runner.Planned:
        meta = {**cell.meta(), runner.ATTEMPT: attempt}
        return runner.Planned(cell.config, cell.run_id, meta, self.label(cell), cell)

    def recover(self, log) -> list[runner.Flight]:
        runs, in_flight = cell_runs(self.sweep, self.base), []
        for cell in self.sweep.cells:
            run_dir = runs.get(cell.key)
            state = run_dir.status()["state"] if run_dir else None
            if state in LIVE:
                attempt = run_dir.meta().get(runner.ATTEMPT, 1)
                in_flight.append(runner.Flight(self._planned(cell, attempt), run_dir, attempt))
            elif state is None or (self.retry_failed and state != State.COMPLETED):
                self.todo.append(self._planned(cell))
            elif state != State.COMPLETED:
                log(f"{self.label(cell)}: {state} ({run_dir.run_id}); --retry-failed reruns it")
        self.done = self.total - len(self.todo) - len(in_flight)
        return in_flight

    def at_once(self) -> list[runner.Planned]:
        """The cells whose executor paces them itself, max_parallel at a time: all go now."""
        at_once = [p for p in self.todo if registry.choose(p.config).starts_sweeps_at_once]
        self.todo = [p for p in self.todo if p not in at_once]
        return at_once

    def next(self) -> runner.Planned | None:
        return self.todo.pop(0) if self.todo else None

    def relaunch(self, flight: runner.Flight, reason: str) -> None:
        self.log(f"{flight.planned.label}: failed ({reason}); launched again from the start")
        self.todo.insert(0, self._planned(flight.planned.item, flight.attempt + 1))

    def ended(self, flight: runner.Flight, reason: str) -> None:
        self.done += 1
        state = flight.state
        said = f" ({reason})" if state != State.COMPLETED else _accuracy(flight.run)
        self.log(f"[{self.done}/{self.total}] {flight.planned.label}: {state}{said}")

    def progress(self, word: str, in_flight: int, limit: int) -> str | None:
        if word == "done":
            return None
        return (
            f"sweep {self.name}: {counted(self.total, 'cell')}, {self.done} ended, "
            f"{in_flight} in flight, {len(self.todo)} to launch, {limit} at a time"
        )


def run(
    sweep: Sweep | str | Path,
    root: str | Path | None = None,
    *,
    max_parallel: int | None = None,
    retry_failed: bool = False,
    log: Callable[[str], None] = print,
    poll_s: float = POLL_S,
    label: Callable[[Cell], str] | None = None,
) -> pd.DataFrame:
    """Run every cell of ``sweep`` that has not completed, at most ``max_parallel`` launched at a
    time (default: as many as the queue's slots hold), and return :func:`results`; each cell
    is logged by its ``label`` (default: its coordinates). Safe to call again after an
    interruption: see the module docstring. One runner per sweep and runs root: a second raises
    :class:`SweepError` while the first is alive."""
    sweep = sweep if isinstance(sweep, Sweep) else load(sweep)
    base = runs_root(root)
    cells = SweepSet(sweep, base, retry_failed, label=label, log=log)
    runner.run(cells, max_parallel=max_parallel, log=log, poll_s=poll_s)
    return results(sweep, base)


def runner_active(name: str, root: str | Path | None = None) -> bool:
    """Whether a runner of sweep ``name`` is alive (it holds the sweep's lock)."""
    return runner.active(runs_root(root) / SWEEPS_DIR, name)


def start(
    sweep: Sweep,
    root: str | Path | None = None,
    *,
    max_parallel: int | None = None,
    retry_failed: bool = False,
    place: registry.Place | None = None,
) -> int:
    """Run ``sweep`` in a background process of its own session (the app's and notebooks'
    way: it outlives them), output to ``<root>/.sweeps/<name>.log``; returns its pid; with
    ``place`` (:func:`placed`), its cells go there. Raises :class:`SweepError` if a runner of
    this sweep is alive already."""
    runner.check_parallel(max_parallel, SweepError)
    flags = [f"--max-parallel={max_parallel}"] * bool(max_parallel)
    flags += ["--retry-failed"] * retry_failed
    if place is not None:
        placed(sweep, place)  # refused here, naming the field, if it is not valid
        flags += registry.with_section(place[0]).flags(place[1])
    return runner.start(SweepSet(sweep, runs_root(root)), flags)


def _label(cell: Cell) -> str:
    return " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in cell.coordinates.items())


def _accuracy(run_dir: RunDir) -> str:
    accuracy = summary(run_dir).get("last_eval_accuracy")
    return "" if accuracy is None else f", test accuracy {accuracy:.4f}"
