"""Running a sweep (:mod:`toolkit.launching.sweep`): every cell that has not completed, through
:mod:`toolkit.launching.launch`, at most ``max_parallel`` at a time; or, for cells whose executor
starts a sweep's runs at once (Slurm's job arrays, whose ``%max_parallel`` Slurm enforces), all
at once (:func:`toolkit.launching.launch.launch_all`).

A sweep resumes by looking, not by remembering: :func:`run` skips completed cells, waits for
cells already queued or running (launched by an earlier runner that was killed), reports failed
or stopped ones (and reruns them, as a new attempt beside the old run, with ``retry_failed``),
and launches the rest. One runner per sweep and runs root holds the sweep's lock
(:func:`runner_active`). Before anything starts, :func:`dry_run` plans every cell
(:class:`~toolkit.plan.RunPlan`) and :func:`estimate` prices it from measured throughputs.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from toolkit import advice, files, safe_yaml
from toolkit.config import ConfigError, ExperimentConfig, from_mapping
from toolkit.launching import launch, remote, runner_lock
from toolkit.launching.executors import registry
from toolkit.launching.slots import capacity, check_fits, positions, slots_of
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
from toolkit.runs import placement
from toolkit.runs.rundir import LIVE, RunDir, list_runs, runs_root
from toolkit.runs.states import State
from toolkit.runs.table import summary
from toolkit.words import counted

POLL_S = 1.0
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
            if registry.choose(c).queues_here:  # else they wait in their executor's queue
                check_fits(slots_of(c), root)
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


def on_slurm(sweep: Sweep, slurm: dict | None) -> Sweep:
    """``sweep`` with every cell's config given a ``slurm`` section of the fields ``slurm``
    (over the section a cell already has; ``None``: unchanged). A cell keeps its key, and so
    its identity: a cell completed on this machine is not run again on Slurm."""
    if slurm is None:
        return sweep
    cells = []
    for cell in sweep.cells:
        raw = cell.config.model_dump(mode="json")
        raw["slurm"] = {**(raw.get("slurm") or {}), **slurm}
        cells.append(dataclasses.replace(cell, config=from_mapping(raw)))
    return dataclasses.replace(sweep, cells=tuple(cells))


def default_parallel(sweep: Sweep, root: str | Path | None = None) -> int:
    """How many cells fit the queue's capacity at once (at least 1)."""
    have = capacity(root)
    fits = [
        min(have.get(host, need) // need for host, need in slots_of(cell.config).items())
        for cell in sweep.cells
    ]
    return max(1, min(fits, default=1))


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
    _check_parallel(max_parallel)
    sweep = sweep if isinstance(sweep, Sweep) else load(sweep)
    base = runs_root(root)
    dry_run(sweep, base)  # every cell can launch, before any does
    with _runner_lock(sweep.name, base):
        save(sweep, base)
        return _run(sweep, base, max_parallel, retry_failed, log, poll_s, label or _label)


def _run(sweep, base, max_parallel, retry_failed, log, poll_s, label) -> pd.DataFrame:
    limit = max_parallel or default_parallel(sweep, base)
    runs = cell_runs(sweep, base)
    todo, in_flight, total = [], {}, len(sweep.cells)
    for cell in sweep.cells:
        run_dir = runs.get(cell.key)
        state = run_dir.status()["state"] if run_dir else None
        if state in LIVE:
            in_flight[cell.key] = (cell, run_dir)
        elif state is None or (retry_failed and state != State.COMPLETED):
            todo.append(cell)
        elif state != State.COMPLETED:
            log(f"{label(cell)}: {state} ({run_dir.run_id}); --retry-failed reruns it")
    done = total - len(todo) - len(in_flight)
    log(
        f"sweep {sweep.name}: {counted(total, 'cell')}, {done} ended, {len(in_flight)} in flight, "
        f"{len(todo)} to launch, {limit} at a time"
    )
    at_once = [cell for cell in todo if registry.choose(cell.config).starts_sweeps_at_once]
    if at_once:  # their executor paces them, max_parallel at a time: all go now
        todo = [cell for cell in todo if cell not in at_once]
        cells = [(c.config, free_id(c.run_id, base), c.meta()) for c in at_once]
        started = launch.launch_all(cells, sweep.name, base, max_parallel)
        for cell, run_dir in zip(at_once, started, strict=True):
            in_flight[cell.key] = (cell, run_dir)
        where = placement.where(started[0].status())
        log(f"submitted {counted(len(at_once), 'cell')} at once ({where}...)")
    while todo or in_flight:
        while todo and len(in_flight) < limit:
            cell = todo.pop(0)
            run_id = free_id(cell.run_id, base)
            run_dir = launch.launch(
                cell.config, runs_root_dir=base, run_id=run_id, meta=cell.meta()
            )
            in_flight[cell.key] = (cell, run_dir)
        time.sleep(poll_s)
        for key, (cell, run_dir) in list(in_flight.items()):
            status = launch.settle(run_dir)
            if status["state"] not in LIVE:
                del in_flight[key]
                done += 1
                log(f"[{done}/{total}] {label(cell)}: {status['state']}{_outcome(run_dir, status)}")
    return results(sweep, base)


def _runner_lock(name: str, base: Path):
    refusal = SweepError(f"sweep {name!r} is already being run by another process")
    return runner_lock.held(base / SWEEPS_DIR / f"{name}.lock", refusal)


def runner_active(name: str, root: str | Path | None = None) -> bool:
    """Whether a runner of sweep ``name`` is alive (it holds the sweep's lock)."""
    return runner_lock.is_held(runs_root(root) / SWEEPS_DIR / f"{name}.lock")


def _check_parallel(max_parallel: int | None) -> None:
    if max_parallel is not None and (
        isinstance(max_parallel, bool) or not isinstance(max_parallel, int) or max_parallel < 1
    ):
        raise SweepError(f"max_parallel must be an integer >= 1 (got {max_parallel!r})")


def start(
    sweep: Sweep,
    root: str | Path | None = None,
    *,
    max_parallel: int | None = None,
    retry_failed: bool = False,
    slurm: dict | None = None,
) -> int:
    """Run ``sweep`` in a background process of its own session (the app's and notebooks'
    way: it outlives them), output to ``<root>/.sweeps/<name>.log``; returns its pid; with
    ``slurm`` (the fields of a ``slurm`` section, :func:`on_slurm`), its cells go to Slurm.
    Raises :class:`SweepError` if a runner of this sweep is alive already."""
    _check_parallel(max_parallel)
    base = runs_root(root)
    if runner_active(sweep.name, base):
        raise SweepError(f"sweep {sweep.name!r} is already being run by another process")
    command = [
        sys.executable,
        "-m",
        "toolkit",
        "--runs",
        str(base),
        "sweep",
        str(save(sweep, base)),
    ]
    command += [f"--max-parallel={max_parallel}"] * bool(max_parallel)
    command += ["--retry-failed"] * retry_failed
    if slurm is not None:
        on_slurm(sweep, slurm)  # refused here, naming the field, if it is not valid
        command += ["--slurm", *_slurm_flags(slurm)]
    return detached(command, base / SWEEPS_DIR / f"{sweep.name}.log")


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


def _slurm_flags(slurm: dict) -> list[str]:
    """The CLI's flags for the fields of a ``slurm`` section (see ``python -m toolkit sweep``)."""
    flags = []
    for field, value in slurm.items():
        if field == "sbatch_args":
            flags += [f"--sbatch-arg={arg}" for arg in value]
        elif field == "signal_before_end_s":
            raise SweepError("slurm.signal_before_end_s is set in the sweep's base config only")
        else:
            flags.append(f"--{field.replace('_', '-')}={value}")
    return flags


def free_id(run_id: str, base: Path) -> str:
    """``run_id``, or ``run_id-2``, ``-3``... for a rerun beside an earlier attempt."""
    attempt, candidate = 1, run_id
    while (base / candidate).exists():
        attempt += 1
        candidate = f"{run_id[: 64 - len(str(attempt)) - 1]}-{attempt}"
    return candidate


def _label(cell: Cell) -> str:
    return " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in cell.coordinates.items())


def _outcome(run_dir: RunDir, status: dict) -> str:
    if status["state"] != State.COMPLETED:
        return f" ({status.get('reason') or 'no reason recorded'})"
    accuracy = summary(run_dir).get("last_eval_accuracy")
    return "" if accuracy is None else f", test accuracy {accuracy:.4f}"
