"""Sweeps: a grid of runs as one object, launched through the queue, resumable, with results.

A sweep file::

    name: lb-study
    base: experiments/quickstart.yaml      # an experiment config (a path, or the mapping itself)
    grid:                                  # dotted config paths -> values (cartesian product)
      batch.global_size: [32, 256, 1024]
      optimizer.name: [sgd, lars]
    methods:                               # optional: named bundles of overrides, one axis
      goyal: {lr_scaling.rule: linear, schedule.warmup.epochs: 3}
      lars_sqrt: {optimizer.name: lars, lr_scaling.rule: sqrt}
    seeds: [0, 1, 2]                       # optional (default: the base config's seed)

``grid`` may also be a list of such mappings: the cells are the union of their products, in
order (scikit-learn's ``ParameterGrid``). Inside a grid mapping, the key ``method`` restricts
the ``methods`` axis to the named ones; without it, every method is crossed with that grid.

A cell's config is the base, then its method's overrides, then its grid coordinates, then its
seed (later wins). Every cell is validated before anything starts (:func:`expand`); a bad one
is refused with its coordinates and the field's message.

Each cell is an ordinary run directory, labelled in ``meta.json`` with ``sweep`` (the name),
``cell`` (a hash of the cell's whole config, its identity) and ``coordinates``. So a sweep
resumes by looking, not by remembering: :func:`run` skips completed cells, waits for cells
already queued or running (launched by an earlier runner that was killed), reports failed or
stopped ones (and reruns them, as a new attempt beside the old run, with ``retry_failed``), and
launches the rest, at most ``max_parallel`` at a time, through :mod:`toolkit.launching.launch` and
its slot-aware queue. Editing the base or a value makes new cells; the old runs stay but are no
longer the sweep's.

:func:`results` reads one row per cell back from the run directories, :func:`aggregate` the mean
and spread over seeds, and :func:`figure` draws any metric against any axis.
"""

from __future__ import annotations

import collections
import fcntl
import hashlib
import itertools
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from toolkit import config as config_lib
from toolkit import files, safe_yaml
from toolkit.config import ConfigError, ExperimentConfig
from toolkit.launching import launch, remote
from toolkit.launching.slots import capacity, check_fits, positions, slots_of
from toolkit.runs.curves import updates_by_epoch
from toolkit.runs.events import read_events
from toolkit.runs.rundir import LIVE, RunDir, list_runs, runs_root, summary

SWEEPS_DIR = ".sweeps"
"""Where :func:`run` keeps each sweep's resolved file, in the runs root (``<name>.yaml``)."""
SEED = "seed"
METHOD = "method"
POLL_S = 1.0
MAX_CELLS = 10_000  # each cell is a run directory: more is a typo in the grid
DIVERGED = "NonFiniteLoss: loss became"
"""What training's failure reason holds when the loss became NaN or infinite
(``toolkit.training.callbacks.NonFiniteLoss``, named here without importing TensorFlow)."""
METRICS = (
    "final_test_accuracy",
    "best_test_accuracy",
    "final_test_loss",
    "final_train_loss",
    "updates",
    "wall_s",
    "samples_per_sec",
)


class SweepError(ConfigError):
    """A sweep that cannot run; the message names every bad field or cell."""


Values = list[Any]


class SweepSpec(BaseModel):
    """The sweep file's schema (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    base: str | dict[str, Any]
    grid: dict[str, Values] | list[dict[str, Values]]
    methods: dict[str, dict[str, Any]] = Field(default_factory=dict)
    seeds: list[int] | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if problem := config_lib.run_name_problem(value):
            raise ValueError(f"sweep names {problem}")
        if len(value) > 32:
            raise ValueError("sweep names have at most 32 characters (they prefix run ids)")
        return value

    @field_validator("grid")
    @classmethod
    def _grid(cls, value):
        grids = value if isinstance(value, list) else [value]
        if not grids or not all(grids):
            raise ValueError("the grid is empty: give at least one path and its values")
        for grid in grids:
            for path, values in grid.items():
                if not values:
                    raise ValueError(f"{safe_yaml.short(path)} has no values: give at least one")
                if path == SEED:
                    raise ValueError("seeds go in `seeds`, not in the grid")
        return value

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, value):
        if value is not None and not value:
            raise ValueError("seeds is empty: leave it out for the base config's seed")
        return value

    def grids(self) -> list[dict[str, Values]]:
        return self.grid if isinstance(self.grid, list) else [self.grid]


@dataclass(frozen=True)
class Cell:
    """One run of a sweep: its coordinates (``method``, grid paths, ``seed``), its config (named
    after its run id) and its key, a hash of that config without the name."""

    sweep: str
    coordinates: dict[str, Any]
    config: ExperimentConfig = field(compare=False)
    key: str

    @property
    def run_id(self) -> str:
        return self.config.name

    def meta(self) -> dict[str, Any]:
        return {"sweep": self.sweep, "cell": self.key, "coordinates": self.coordinates}


def cell_run_id(sweep: str, coordinates: dict[str, Any], key: str) -> str:
    """``<sweep>-<coordinate values>-<key>``: readable, unique, a valid run id."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(map(str, coordinates.values())))
    room = 64 - len(sweep) - len(key) - 2
    return f"{sweep}-{slug[:room].strip('_-')}-{key}"


@dataclass(frozen=True)
class Sweep:
    """A validated sweep: its spec (base inlined) and its cells, in order."""

    spec: SweepSpec
    cells: tuple[Cell, ...]

    @property
    def name(self) -> str:
        return self.spec.name

    def axes(self) -> list[str]:
        """The coordinate names, ``method`` first and ``seed`` last."""
        return list(dict.fromkeys(k for cell in self.cells for k in cell.coordinates))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.spec.model_dump(exclude_none=True), sort_keys=False)


def load(path: str | Path) -> Sweep:
    """Read and expand a sweep file. ``base`` is read relative to the working directory or,
    failing that, to the sweep file's folder."""
    path = Path(path)
    try:
        raw = safe_yaml.load_file(path)
    except FileNotFoundError:
        raise SweepError(f"sweep file {safe_yaml.short(str(path))} does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise SweepError(f"{path}: cannot be read as a YAML sweep: {error}") from None
    except safe_yaml.YamlError as error:
        raise SweepError(str(error)) from None
    return from_mapping(raw, folder=path.parent)


def from_mapping(raw: Any, folder: str | Path = ".") -> Sweep:
    """Validate a sweep mapping and every one of its cells (see :func:`expand`)."""
    if not isinstance(raw, dict):
        raise SweepError("a sweep file is a mapping with name, base, grid (methods, seeds)")
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as error:
        message = config_lib.format_errors(error).replace("experiment config", "sweep file")
        raise SweepError(message) from None
    if isinstance(spec.base, str):
        spec = spec.model_copy(update={"base": _read_base(spec.base, Path(folder))})
    return Sweep(spec, tuple(expand(spec)))


def _read_base(name: str, folder: Path) -> dict[str, Any]:
    path = next((p for p in (Path(name), folder / name) if p.is_file()), None)
    if path is None:
        raise SweepError(
            f"base: config file {safe_yaml.short(name)} does not exist (nor in {folder})"
        )
    try:
        raw = safe_yaml.load_file(path)
        if not isinstance(raw, dict):
            raise SweepError(f"base: {path} is not a mapping of config sections")
        config_lib.from_mapping(raw)  # a bad base is reported once, as the base's fault
    except (OSError, UnicodeDecodeError, safe_yaml.YamlError, ConfigError) as error:
        raise SweepError(f"base {path}: {error}") from None
    return raw


def expand(spec: SweepSpec) -> list[Cell]:
    """Every cell of ``spec``, validated: raises :class:`SweepError` listing each bad cell by its
    coordinates with the field's message (the first 10, and how many more)."""
    seeds = spec.seeds or [None]
    count = sum(
        len(grid.get(METHOD) or list(spec.methods) or [None])
        * math.prod(len(values) for path, values in grid.items() if path != METHOD)
        * len(seeds)
        for grid in spec.grids()
    )
    if count > MAX_CELLS:
        raise SweepError(f"sweep {spec.name!r}: {count:,} cells, over the limit of {MAX_CELLS:,}")
    cells, problems = [], []
    for grid in spec.grids():
        unknown = [m for m in grid.get(METHOD, []) if m not in spec.methods]
        if unknown:
            known = ", ".join(spec.methods) or "none defined"
            raise SweepError(
                f"grid: method {safe_yaml.short(unknown[0])} is not in methods ({known})"
            )
        methods = grid.get(METHOD) or list(spec.methods) or [None]
        paths = [p for p in grid if p != METHOD]
        for method, *values, seed in itertools.product(methods, *(grid[p] for p in paths), seeds):
            coordinates = {METHOD: method} if method is not None else {}
            coordinates |= dict(zip(paths, values, strict=True))
            try:
                cells.append(_cell(spec, method, coordinates, seed))
            except ConfigError as error:
                seeded = coordinates | ({SEED: seed} if seed is not None else {})
                problems.append(_problem(seeded, error))
    _refuse(spec.name, problems)
    counts = collections.Counter(c.key for c in cells)
    if len(counts) != len(cells):
        twice = next(c for c in cells if counts[c.key] > 1)
        raise SweepError(
            f"two cells of sweep {spec.name!r} have the same config: {twice.coordinates}"
        )
    return cells


def _problem(coordinates: dict[str, Any], error: Exception) -> str:
    where = ", ".join(f"{k}={v}" for k, v in coordinates.items())
    return f"cell ({where}): " + str(error).removeprefix("invalid experiment config:\n").strip()


def _refuse(name: str, problems: list[str]) -> None:
    """Raise :class:`SweepError` listing ``problems`` (the first 10, and how many more)."""
    if problems:
        more = [f"... and {len(problems) - 10} more"] if len(problems) > 10 else []
        raise SweepError(f"invalid sweep {name!r}:\n  " + "\n  ".join(problems[:10] + more))


def _cell(spec: SweepSpec, method: str | None, coordinates: dict, seed: int | None) -> Cell:
    raw = json.loads(json.dumps(spec.base))
    changes = {  # copied: a grid path into a method's mapping must not change the method
        **json.loads(json.dumps(spec.methods.get(method) or {})),
        **{k: v for k, v in coordinates.items() if k != METHOD},
    }
    for path, value in changes.items():
        config_lib.set_path(raw, path, value)
    if seed is not None:
        raw[SEED] = seed
    coordinates = {**coordinates, SEED: raw.get(SEED, 0)}
    raw["name"] = spec.name
    config = config_lib.from_mapping(raw)
    key = hashlib.sha1(config.model_dump_json(exclude={"name"}).encode()).hexdigest()[:8]
    config = config.model_copy(update={"name": cell_run_id(spec.name, coordinates, key)})
    return Cell(spec.name, coordinates, config, key)


# --------------------------------------------------------------------------------- the plan


def dry_run(sweep: Sweep, root: str | Path | None = None) -> pd.DataFrame:
    """One row per cell: coordinates, run id, workers, global batch, scaled rate, total steps
    (per worker) and updates (with AdaScale, the most it can take: as many updates as its
    base run, at a gain of 1). Raises :class:`SweepError` naming every cell that could not
    launch: a batch larger than its workers' shards of the dataset, or more workers than the
    launch queue's slots (of the runs root ``root``)."""
    from toolkit.training.experiment import (  # Keras: for the plan only
        adascale_updates,
        load_dataset,
        most_steps_per_update,
        steps_per_epoch,
    )

    sizes: dict[str, int] = {}
    rows, problems = [], []
    for cell in sweep.cells:
        c = cell.config
        dataset = json.dumps([c.dataset.name, c.dataset.params, c.seed], sort_keys=True)
        try:
            if dataset not in sizes:
                sizes[dataset] = len(load_dataset(c).x_train)
            steps = c.epochs * steps_per_epoch(c, sizes[dataset], c.workers)
            updates = steps // c.steps_per_update()
            if c.lr_scaling.rule == "adascale":  # at most: at a gain of 1, its largest batch
                updates = adascale_updates(c, sizes[dataset])
                steps = updates * most_steps_per_update(c, c.workers)
            check_fits(slots_of(c), root)
        except (ValueError, RuntimeError) as error:  # ConfigError, RunError; offline data
            problems.append(_problem(cell.coordinates, error))
            continue
        rows.append(
            {
                **cell.coordinates,
                "run_id": cell.run_id,
                "workers": c.workers,
                "global_batch": c.global_batch(),
                "scaled_lr": c.scaled_learning_rate(),
                "total_steps": steps,
                "updates": updates,
            }
        )
    _refuse(sweep.name, problems)
    return pd.DataFrame(rows)


def throughputs(root: str | Path | None = None, summarize=summary) -> dict[tuple, float]:
    """The median samples/s of the completed runs under ``root``, by what sets a run's speed on
    this machine: dataset, model, workers and per-worker batch (``summarize``: the dashboard
    passes its cached :func:`~toolkit.runs.rundir.summary`)."""
    measured = collections.defaultdict(list)
    for run in list_runs(root):
        row = summarize(run)
        if row["state"] != "completed" or not row["samples_per_sec"]:
            continue
        try:
            measured[_speed_key(run.config())].append(row["samples_per_sec"])
        except (OSError, ConfigError):
            continue
    return {key: float(pd.Series(rates).median()) for key, rates in measured.items()}


def estimate(sweep: Sweep, plan: pd.DataFrame, rates: dict[tuple, float]) -> pd.Series:
    """Each cell's training time in seconds (its :func:`dry_run` row's updates x global batch
    at the measured ``rates`` of :func:`throughputs`), ``NaN`` where no run measured it."""
    keys = [_speed_key(cell.config) for cell in sweep.cells]
    rate = pd.Series([rates.get(key, float("nan")) for key in keys], index=plan.index)
    return plan["updates"] * plan["global_batch"] / rate


def _speed_key(config: ExperimentConfig) -> tuple:
    model = json.dumps([config.model.name, config.model.params], sort_keys=True)
    return (config.dataset.name, model, config.workers, config.per_worker_batch())


# ------------------------------------------------------------------------------- the runner


def cell_runs(sweep: Sweep | str, root: str | Path | None = None) -> dict[str, RunDir]:
    """``{cell key: its latest run}`` for the runs labelled with this sweep's name."""
    name = sweep if isinstance(sweep, str) else sweep.name
    found: dict[str, RunDir] = {}
    for run in reversed(list_runs(root)):  # oldest first: a later attempt replaces an earlier
        meta = run.meta()
        if meta.get("sweep") == name and isinstance(meta.get("cell"), str):
            found[meta["cell"]] = run
    return found


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
) -> pd.DataFrame:
    """Run every cell of ``sweep`` that has not completed, at most ``max_parallel`` launched at a
    time (default: as many as the queue's slots hold), and return :func:`results`. Safe to
    call again after an interruption: see the module docstring. One runner per sweep and runs
    root: a second raises :class:`SweepError` while the first is alive."""
    _check_parallel(max_parallel)
    sweep = sweep if isinstance(sweep, Sweep) else load(sweep)
    base = runs_root(root)
    dry_run(sweep, base)  # every cell can launch, before any does
    with _runner_lock(sweep.name, base):
        save(sweep, base)
        return _run(sweep, base, max_parallel, retry_failed, log, poll_s)


def _run(sweep, base, max_parallel, retry_failed, log, poll_s) -> pd.DataFrame:
    limit = max_parallel or default_parallel(sweep, base)
    runs = cell_runs(sweep, base)
    todo, in_flight, total = [], {}, len(sweep.cells)
    for cell in sweep.cells:
        run_dir = runs.get(cell.key)
        state = run_dir.status()["state"] if run_dir else None
        if state in LIVE:
            in_flight[cell.key] = (cell, run_dir)
        elif state is None or (retry_failed and state != "completed"):
            todo.append(cell)
        elif state != "completed":
            log(f"{_label(cell)}: {state} ({run_dir.run_id}); --retry-failed reruns it")
    done = total - len(todo) - len(in_flight)
    log(
        f"sweep {sweep.name}: {total} cells, {done} ended, {len(in_flight)} in flight, "
        f"{len(todo)} to launch, {limit} at a time"
    )
    while todo or in_flight:
        while todo and len(in_flight) < limit:
            cell = todo.pop(0)
            run_id = _free_id(cell.run_id, base)
            run_dir = launch.launch(
                cell.config, runs_root_dir=base, run_id=run_id, meta=cell.meta()
            )
            in_flight[cell.key] = (cell, run_dir)
        time.sleep(poll_s)
        for key, (cell, run_dir) in list(in_flight.items()):
            status = run_dir.status()
            if status["state"] not in LIVE:
                del in_flight[key]
                done += 1
                log(
                    f"[{done}/{total}] {_label(cell)}: {status['state']}{_outcome(run_dir, status)}"
                )
    return results(sweep, base)


@contextmanager
def _runner_lock(name: str, base: Path) -> Iterator[None]:
    path = base / SWEEPS_DIR / f"{name}.lock"
    with files.writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SweepError(f"sweep {name!r} is already being run by another process") from None
        yield
    finally:
        os.close(fd)


def runner_active(name: str, root: str | Path | None = None) -> bool:
    """Whether a runner of sweep ``name`` is alive (it holds the sweep's lock)."""
    if not (runs_root(root) / SWEEPS_DIR / f"{name}.lock").exists():
        return False
    try:
        with _runner_lock(name, runs_root(root)):
            return False
    except SweepError:
        return True


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
) -> int:
    """Run ``sweep`` in a background process of its own session (the app's and notebooks'
    way: it outlives them), output to ``<root>/.sweeps/<name>.log``; returns its pid. Raises
    :class:`SweepError` if a runner of this sweep is alive already."""
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
    log_path = base / SWEEPS_DIR / f"{sweep.name}.log"
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


def save(sweep: Sweep, root: str | Path | None = None) -> Path:
    """Keep the resolved sweep (base inlined) in the runs root, for the dashboard."""
    path = runs_root(root) / SWEEPS_DIR / f"{sweep.name}.yaml"
    with files.writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
    files.replace(path, sweep.to_yaml().encode())
    return path


def saved(root: str | Path | None = None) -> list[Sweep]:
    """The sweeps run under this runs root (those that still validate), by name."""
    found = []
    for path in sorted((runs_root(root) / SWEEPS_DIR).glob("*.yaml")):
        try:
            found.append(load(path))
        except ConfigError:
            continue
    return found


def _free_id(run_id: str, base: Path) -> str:
    """``run_id``, or ``run_id-2``, ``-3``... for a rerun beside an earlier attempt."""
    attempt, candidate = 1, run_id
    while (base / candidate).exists():
        attempt += 1
        candidate = f"{run_id[: 64 - len(str(attempt)) - 1]}-{attempt}"
    return candidate


def _label(cell: Cell) -> str:
    return " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in cell.coordinates.items())


def _outcome(run_dir: RunDir, status: dict) -> str:
    if status["state"] != "completed":
        return f" ({status.get('reason') or 'no reason recorded'})"
    accuracy = summary(run_dir).get("last_eval_accuracy")
    return "" if accuracy is None else f", test accuracy {accuracy:.4f}"


# ---------------------------------------------------------------------------------- results


def results(sweep: Sweep, root: str | Path | None = None, events=None) -> pd.DataFrame:
    """One row per cell, in the sweep's order: coordinates, ``run_id``, ``state``, ``diverged``
    (the loss became NaN or infinite), the :data:`METRICS` (final ones only for a completed
    run; ``updates``: optimizer updates taken) and ``global_batch``. ``events(run)`` reads a
    run's events (default :func:`toolkit.runs.events.read_events`; the app passes its cache)."""
    runs = cell_runs(sweep, root)
    rows = []
    for cell in sweep.cells:
        run_dir = runs.get(cell.key)
        row = {**cell.coordinates, "run_id": run_dir.run_id if run_dir else None}
        rows.append(row | _measure(cell, run_dir, events))
    return pd.DataFrame(rows)


def _measure(cell: Cell, run_dir: RunDir | None, events) -> dict[str, Any]:
    if run_dir is None:
        return {
            "state": "pending",
            "diverged": False,
            **dict.fromkeys(METRICS, math.nan),
            "global_batch": cell.config.global_batch(),
            "reason": None,
        }
    history = (events or _read_events)(run_dir)
    row = summary(run_dir, history)
    completed = row["state"] == "completed"
    evals = history[history["phase"] == "eval"] if "phase" in history else history.iloc[0:0]
    losses = evals["loss"].dropna() if "loss" in evals else evals.iloc[0:0]
    steps = run_dir.meta().get("total_steps")
    updates = steps // cell.config.steps_per_update() if steps else None
    if cell.config.lr_scaling.rule == "adascale" and completed:  # total_steps counts its clock
        updates = _adascale_updates(cell.config, history, evals)
    return {
        "state": row["state"],
        "diverged": DIVERGED in str(row.get("reason") or ""),
        "final_test_accuracy": row["last_eval_accuracy"] if completed else math.nan,
        "best_test_accuracy": row["best_eval_accuracy"],
        "final_test_loss": float(losses.iloc[-1]) if completed and len(losses) else math.nan,
        "final_train_loss": row["last_loss"] if completed else math.nan,
        "updates": updates,
        "wall_s": row["duration_s"],
        "samples_per_sec": row["samples_per_sec"],
        "global_batch": cell.config.global_batch(),
        "reason": row.get("reason"),
    }


def _adascale_updates(config, history: pd.DataFrame, evals: pd.DataFrame) -> int:
    """The updates an AdaScale run took (an outcome): its steps over its steps per update;
    for an adaptive batch, epoch by epoch, at the batch each eval event says its epoch had."""
    per_update = config.steps_per_update()
    if "global_batch" not in evals:
        return int(history["step"].max()) // per_update
    return round(updates_by_epoch(evals, config.global_batch() // per_update).iloc[-1])


def _read_events(run_dir: RunDir) -> pd.DataFrame:
    try:
        return read_events(run_dir.events_path)
    except OSError:
        return pd.DataFrame()


def aggregate(
    table: pd.DataFrame, metrics: tuple[str, ...] = METRICS, by: list[str] | None = None
) -> pd.DataFrame:
    """Mean, standard deviation and count over seeds of each metric, per combination of ``by``
    (default: every coordinate but ``seed``), with the number of cells that ``failed`` (failed
    or stopped), ``diverged`` or are not ended yet (``pending``: pending, queued or running).
    A metric's mean and std are over the completed cells only."""
    by = axes_of(table) if by is None else by
    rows = []
    for values, group in table.groupby(by, sort=False, dropna=False) if by else [((), table)]:
        ok = group[group["state"] == "completed"]
        row = dict(zip(by, values if isinstance(values, tuple) else (values,), strict=True))
        row |= {
            "cells": len(group),
            "completed": len(ok),
            "failed": int(group["state"].isin(["failed", "stopped", "unreadable"]).sum()),
            "diverged": int(group["diverged"].sum()),
            "pending": int(group["state"].isin(["pending", *LIVE]).sum()),
        }
        for metric in metrics:
            series = pd.to_numeric(ok[metric], errors="coerce").dropna() if metric in ok else ()
            row[f"{metric}_mean"] = series.mean() if len(series) else math.nan
            row[f"{metric}_std"] = series.std(ddof=1) if len(series) > 1 else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def axes_of(table: pd.DataFrame) -> list[str]:
    """The coordinate columns of a :func:`results` table, but ``seed``."""
    return [c for c in table.columns if c not in _ROW_COLUMNS and c != SEED]


_ROW_COLUMNS = {"run_id", "state", "diverged", "reason", "global_batch", *METRICS}


def figure(
    table: pd.DataFrame,
    metric: str = "final_test_accuracy",
    x: str = "batch.global_size",
    color: str | None = METHOD,
    title: str | None = None,
):
    """Plotly figure of ``metric`` (mean ± std over seeds) against the column ``x``, one line
    per combination of the other axes (``color`` first in the legend, so one line per method
    when it is the only other axis); a log x-axis for numbers spanning a factor of 8 or more."""
    import plotly.graph_objects as go

    from toolkit.runs import theme

    axes = [a for a in axes_of(table) if a != x]
    lines = sorted(axes, key=lambda a: a != color)
    means = aggregate(table, (metric,), by=[*lines, x])
    fig = go.Figure()
    groups = means.groupby(lines, sort=False, dropna=False) if lines else [("all", means)]
    for name, part in groups:
        part = part.sort_values(x)
        fig.add_trace(
            go.Scatter(
                x=part[x],
                y=part[f"{metric}_mean"],
                error_y={"type": "data", "array": part[f"{metric}_std"].fillna(0)},
                mode="lines+markers",
                name=", ".join(map(str, name)) if isinstance(name, tuple) else str(name),
            )
        )
    numeric = pd.to_numeric(means[x], errors="coerce")
    log = numeric.notna().all() and numeric.min() > 0 and numeric.max() / numeric.min() >= 8
    fig.update_layout(
        title=title or f"{metric} against {x} (mean ± std over seeds)",
        xaxis={"title": x, "type": "log" if log else None},
        yaxis={"title": metric},
        legend={"title": ", ".join(lines)},
        template=theme.NAME,
    )
    return fig
