"""``calibrate``: the critical batch of the user's own config, by McCandlish et al.'s
steps-to-target method (:mod:`toolkit.scaling.critical_batch`) run as an ordinary sweep.

The grid (:func:`grid`): batches around the config's global batch (default ¼×, 1×, 4× and
16×, those with at least 10 updates an epoch), each at its own rates (the config's rate scaled
to that batch by its ``lr_scaling`` rule, times ½, 1 and 2), each trained for a few epochs (more
for larger batches; its held-out loss read 40 times whatever its batch) at a constant rate (no
warmup, no decay, no AdaScale, no adaptive batch: the rate a batch is measured at must not
change under it), with the gradient noise scale measured every :data:`NOISE_EVERY` updates. Its
cells are sweep cells: resumable, listed, comparable, priced by the Sweep page's estimate
before they start.

Reading it (:func:`measure`): each run's held-out loss at each evaluation gives its updates to
each target loss (:func:`~toolkit.scaling.critical_batch.steps_to_target`, interpolated between
evaluations); the targets, unless given, are the loosest loss every batch reached and
:data:`TARGET_FACTORS` of it; ``B_simple`` near a target pools a run's noise-scale measurements
over the second half of its way there. :func:`calibrate` runs, fits and keeps the result in
the runs root for the probe.
"""

from __future__ import annotations

import datetime
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from toolkit import config as config_lib
from toolkit import files
from toolkit.config import ExperimentConfig
from toolkit.launching import runner, sweep_runner
from toolkit.launching import sweep as sweep_lib
from toolkit.launching.sweep_results import cell_runs
from toolkit.plan import RunPlan, Scale
from toolkit.runs.events import read_events
from toolkit.runs.rundir import runs_root
from toolkit.runs.states import State
from toolkit.scaling import critical_batch
from toolkit.scaling.critical_batch import Calibration, TargetFit
from toolkit.words import counted

BATCH_FACTORS = (0.25, 1.0, 4.0, 16.0)
RATE_FACTORS = (0.5, 1.0, 2.0)
EPOCHS = 5  # at most, at the config's own batch: a config with fewer trains its own
MIN_UPDATES_PER_EPOCH = 10
EVALUATIONS = 40  # held-out evaluations per run, whatever its batch
NOISE_EVERY = 5
TARGET_FACTORS = (1.3, 1.15, 1.0)
"""Without ``targets``: the loosest loss every batch reached (its best rate, its worst seed)
times each of these."""
ROUNDS = {"epochs": "rounds", "steps_per_epoch": "updates_per_round"}
"""A calibration run's config ``epochs`` are evaluation rounds (:data:`EVALUATIONS` of them,
each ``steps_per_epoch`` updates), not passes over the data: its cells are shown (:func:`shown`)
under these names, beside their ``passes``."""
BATCH = "batch.global_size"
RATE = "optimizer.learning_rate"


def grid(
    config: ExperimentConfig,
    *,
    batches: Sequence[int] | None = None,
    rate_factors: Sequence[float] = RATE_FACTORS,
    epochs: int | None = None,
    seeds: Sequence[int] | None = None,
) -> sweep_lib.Sweep:
    """The calibration sweep of ``config`` (named ``cal-<config name>``): ``batches`` (default
    :func:`default_batches`) x the rates of :func:`rates_at`, on ``seeds`` (default: its own).

    A run at the config's global batch ``B0`` trains ``epochs`` passes over the data (default:
    the config's epochs, at most :data:`EPOCHS`); one at ``B`` trains ``sqrt(B / B0)`` times as
    many (at least ``epochs``), since a larger batch needs more examples to reach the same loss
    (all of ``B/B0`` more far above ``B_crit``, none far below it). Each run's updates are cut
    into :data:`EVALUATIONS` rounds of equal length (its config's "epochs" of
    ``steps_per_epoch`` updates, each a fresh shuffle's first batches: :data:`ROUNDS`), so that
    its held-out loss is read as often whatever its batch: a small batch reaches the targets
    within its first pass. Raises :class:`~toolkit.launching.sweep.SweepError` naming every
    cell that cannot be built, or :func:`refuse_unfittable`'s grid."""
    batches = sorted(set(batches or default_batches(config)))
    refuse_unfittable(batches, rate_factors)
    epochs, own = epochs or min(config.epochs, EPOCHS), Scale.of(config).global_batch
    base = config.model_dump(mode="json")
    for path, value in {
        "schedule": {"name": "constant"},
        "lr_scaling.rule": "none",
        "batch.adaptive": None,
        "batch.accumulation": 1,
        "steps_per_epoch": None,
        "logging.noise_scale_every_steps": NOISE_EVERY,
    }.items():
        config_lib.set_path(base, path, value)
    num_train = train_size(config)
    cells = []
    for b in batches:
        at_batch = config_lib.from_mapping({**base, "batch": {"global_size": b}})
        per_epoch = RunPlan.of(at_batch, num_train).steps_per_epoch
        updates = per_epoch * math.ceil(epochs * max(1.0, math.sqrt(b / own)))
        interval = math.ceil(updates / EVALUATIONS)
        cells.append(
            {
                BATCH: [b],
                RATE: rates_at(config, b, rate_factors),
                "epochs": [math.ceil(updates / interval)],
                "steps_per_epoch": [interval],
            }
        )
    spec = {"name": f"cal-{config.name}"[:32], "base": base, "grid": cells}
    return sweep_lib.from_mapping(spec | ({"seeds": list(seeds)} if seeds else {}))


def refuse_unfittable(batches: Sequence[int], rate_factors: Sequence[float]) -> None:
    """Raise :class:`~toolkit.launching.sweep.SweepError` for a grid whose fit could never be
    kept (:func:`~toolkit.scaling.critical_batch.flaws`), naming what is missing: fewer than
    :data:`~toolkit.scaling.critical_batch.MIN_BATCHES` batches, or fewer than
    :data:`~toolkit.scaling.critical_batch.MIN_RATES` rates, where every best rate would be
    at the grid's edge."""
    missing = []
    if len(set(batches)) < critical_batch.MIN_BATCHES:
        missing.append(
            f"{critical_batch.MIN_BATCHES} batches or more (got {sorted(set(batches))}): S(B) "
            "has two parameters, and the third batch is what checks the curve; the config's "
            "training set may be too small for the default grid (--batches)"
        )
    if len(set(rate_factors)) < critical_batch.MIN_RATES:
        missing.append(
            f"{critical_batch.MIN_RATES} rate factors or more (got {sorted(set(rate_factors))}):"
            " a batch's fastest rate is trusted only with a slower rate on each side of it "
            "(--rates 0.5 1 2)"
        )
    if missing:
        raise sweep_lib.SweepError("calibrate needs " + "; and ".join(missing))


def shown(cells: pd.DataFrame, config: ExperimentConfig) -> pd.DataFrame:
    """A calibration's cells (:func:`~toolkit.launching.sweep_runner.dry_run`'s rows) in the
    calibration's words (:data:`ROUNDS`), with each run's ``passes`` over the training data."""
    passes = passes_over(cells["updates"] * cells["global_batch"], config).round(2)
    return cells.rename(columns=ROUNDS).assign(passes=passes)


def passes_over(examples, config: ExperimentConfig):
    """``examples`` (a number or a column) as passes over the config's training data."""
    return examples / train_size(config)


def described(cell) -> str:
    """A calibration cell in its words (:data:`ROUNDS`): ``batch 32, rate 0.25, seed 0: 32
    rounds of 4 updates, 1 pass``."""
    config, at = cell.config, cell.coordinates
    passes = passes_over(config.epochs * config.steps_per_epoch * at[BATCH], config)
    return (
        f"batch {at[BATCH]}, rate {at[RATE]:g}, seed {at[sweep_lib.SEED]}: "
        f"{counted(config.epochs, 'round')} of {counted(config.steps_per_epoch, 'update')}, "
        f"{counted(round(passes, 2), 'pass')}"
    )


def default_batches(config: ExperimentConfig) -> list[int]:
    """:data:`BATCH_FACTORS` of the config's global batch, each a multiple of its workers, up to
    :func:`largest_batch`."""
    workers, batch = config.workers, Scale.of(config).global_batch
    sizes = {max(workers, round(batch * f / workers) * workers) for f in BATCH_FACTORS}
    return sorted(b for b in sizes if b <= largest_batch(config)) or [min(sizes)]


def largest_batch(config: ExperimentConfig) -> int:
    """The largest batch with :data:`MIN_UPDATES_PER_EPOCH` updates an epoch of the config's
    training set."""
    return train_size(config) // MIN_UPDATES_PER_EPOCH


def train_size(config: ExperimentConfig) -> int:
    """The number of training examples of the config's dataset."""
    return config.dataset.train_examples()


def rates_at(config: ExperimentConfig, batch: int, factors: Sequence[float]) -> list[float]:
    """The config's learning rate at ``batch`` (its ``lr_scaling`` rule; AdaScale's base rate)
    times each of ``factors``, to four significant figures."""
    at_batch = config.model_copy(
        update={"batch": config.batch.model_copy(update={"global_size": batch, "adaptive": None})}
    )
    rate = Scale.of(at_batch).learning_rate
    return [float(f"{rate * f:.4g}") for f in factors]


def runs_table(sweep: sweep_lib.Sweep, root: str | Path | None = None) -> pd.DataFrame:
    """Per completed cell, its ``batch``, ``rate`` and ``seed``, its held-out evaluations
    (``evals``: ``updates`` and ``loss``) and noise-scale measurements (``gns``: ``updates``,
    ``trace_sigma_step`` and ``grad_sq_step``)."""
    found, rows = cell_runs(sweep, root), []
    for cell in sweep.cells:
        run = found.get(cell.key)
        if run is None or run.status().get("state") != State.COMPLETED:
            continue
        events = read_events(run.events_path)
        per_update = Scale.of(cell.config).steps_per_update
        events = events.assign(updates=events["step"] / per_update)
        rows.append(
            {
                "batch": cell.coordinates[BATCH],
                "rate": cell.coordinates[RATE],
                "seed": cell.coordinates[sweep_lib.SEED],
                "evals": events.loc[events.phase == "eval", ["updates", "loss"]],
                "gns": events.loc[
                    events.phase == "gns", ["updates", "trace_sigma_step", "grad_sq_step"]
                ],
            }
        )
    return pd.DataFrame(rows)


def default_targets(runs: pd.DataFrame) -> list[float]:
    """The loosest held-out loss that every batch reached (at its best rate, on its worst seed)
    and :data:`TARGET_FACTORS` of it, loosest first."""
    lowest = runs.assign(lowest=[e["loss"].min() for e in runs.evals])
    worst_seed = lowest.groupby(["batch", "rate"]).lowest.max()
    reachable = float(worst_seed.groupby("batch").min().max())
    return [reachable * f for f in TARGET_FACTORS]


def at_targets(runs: pd.DataFrame, targets: Sequence[float]) -> pd.DataFrame:
    """One row per run and target: its ``steps`` (updates) to the target, whether its first
    evaluation was already there (``at_first``), and the noise-scale measurements over the
    second half of its steps (``measurements``, ``grad_sq_sum``, ``trace_sigma_sum``; none for
    a run that never reached it)."""
    rows = []
    for run in runs.itertuples():
        for target in targets:
            steps = critical_batch.steps_to_target(run.evals, target)
            gns = run.gns[(run.gns.updates >= steps / 2) & (run.gns.updates <= steps)]
            rows.append(
                {
                    "batch": run.batch,
                    "rate": run.rate,
                    "seed": run.seed,
                    "target": target,
                    "steps": steps,
                    "at_first": bool(len(run.evals)) and run.evals.loss.iloc[0] <= target,
                    "measurements": len(gns),  # none where it never got there
                    "grad_sq_sum": float(gns.grad_sq_step.sum()),
                    "trace_sigma_sum": float(gns.trace_sigma_step.sum()),
                }
            )
    return pd.DataFrame(rows)


def cautions(fit: TargetFit, runs: pd.DataFrame) -> list[str]:
    """For a fit that is kept, a line for each batch whose steps may be overcounted: its best
    rate is the lowest or highest of its rates (a rate beyond the grid may reach the loss
    sooner). A fit with flaws (:attr:`TargetFit.flaws`) says those instead."""
    lines = []
    for row in fit.best.itertuples() if not fit.flaws else ():
        rates = runs.loc[runs.batch == row.batch, "rate"]
        if rates.nunique() > 1 and row.rate in (rates.min(), rates.max()):
            side = "lowest" if row.rate == rates.min() else "highest"
            lines.append(
                f"at loss {fit.target:.4g}, batch {row.batch}'s best rate {row.rate:g} is its "
                f"{side}: a rate beyond it may reach the loss sooner (--rates)"
            )
    return lines


def measure(
    sweep: sweep_lib.Sweep, root: str | Path | None = None, targets: Sequence[float] | None = None
) -> tuple[list[TargetFit], list[str]]:
    """The fit at each target (default :func:`default_targets`) from the sweep's completed runs,
    and notes: a line for each target that could not be fitted, and :func:`cautions`. Raises
    ``ValueError`` when no run completed."""
    runs = runs_table(sweep, root)
    if runs.empty:
        raise ValueError(f"calibration {sweep.name}: no run of it has completed")
    rows = at_targets(runs, targets or default_targets(runs))
    fits, notes = [], []
    for _, part in rows.groupby("target", sort=False):
        try:
            fits.append(critical_batch.fit(part))
        except ValueError as error:
            notes.append(f"not fitted: {error}")
            continue
        notes += cautions(fits[-1], part)
    return fits, notes


def calibrate(
    config: ExperimentConfig,
    runs_root_dir: str | Path | None = None,
    *,
    sweep: sweep_lib.Sweep | None = None,
    targets: Sequence[float] | None = None,
    max_parallel: int | None = None,
    log: Callable[[str], None] = print,
) -> Calibration:
    """Run ``sweep`` (default :func:`grid` of ``config``; cells already completed are kept),
    fit it and keep the result for ``config``'s task under the runs root, where
    :func:`toolkit.launching.probe.probe` reads it. Raises ``ValueError`` when no target could
    be fitted, naming why for each."""
    sweep = sweep or grid(config)
    root = runs_root(runs_root_dir)
    sweep_runner.run(sweep, root, max_parallel=max_parallel, log=log, label=described)
    fits, notes = measure(sweep, root, targets)
    for line in notes:
        log(line)
    records = [f.record() for f in fits]
    usable = tuple(r for r in records if not r["flaws"])
    if records and len(usable) < len(records):
        log(critical_batch.table(records))
    for fit in fits:
        for flaw in fit.flaws:
            log(f"not kept, at loss {fit.target:.4g}: {flaw}")
    if not usable:
        raise NotKept(
            f"calibration {sweep.name}: nothing kept, no fit can be stood behind (above); "
            "whatever was kept for this task before is unchanged"
        )
    calibration = Calibration(
        task=critical_batch.task_key(config),
        sweep=sweep.name,
        date=datetime.date.today().isoformat(),
        fits=usable,
    )
    if before := critical_batch.stored(config, root):
        log(
            f"replaces the calibration kept for this task from sweep {before.sweep} ({before.date})"
        )
    critical_batch.save(calibration, root)
    return calibration


class NotKept(ValueError):
    """A calibration ran but none of its fits can be stood behind: nothing was kept."""


def start(
    config: ExperimentConfig,
    runs_root_dir: str | Path | None = None,
    *,
    batches: Sequence[int] | None = None,
    rate_factors: Sequence[float] = RATE_FACTORS,
    epochs: int | None = None,
    max_parallel: int | None = None,
) -> int:
    """:func:`calibrate` in a background process (the app's and notebooks' way: it outlives
    them): ``python -m toolkit calibrate --yes`` on ``config``, kept as
    ``<root>/.calibrations/<sweep>.yaml``, its output in ``<sweep>.log`` beside it; returns its
    pid. Raises :class:`~toolkit.launching.sweep.SweepError` if the grid cannot be built or a
    runner of it is alive already."""
    batches = batches or default_batches(config)
    sweep = grid(config, batches=batches, rate_factors=rate_factors, epochs=epochs)
    root = runs_root(runs_root_dir)
    if sweep_runner.runner_active(sweep.name, root):
        raise sweep_lib.SweepError(f"calibration {sweep.name!r} is already running")
    folder = root / critical_batch.CALIBRATIONS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    config_path = folder / f"{sweep.name}.yaml"
    files.replace(config_path, config.to_yaml().encode())
    command = [sys.executable, "-m", "toolkit", "--runs", str(root), "calibrate"]
    command += [str(config_path), "--yes", "--batches", *map(str, batches)]
    command += ["--rates", *map(str, rate_factors)]
    command += [f"--epochs={epochs}"] * bool(epochs)
    command += [f"--max-parallel={max_parallel}"] * bool(max_parallel)
    return runner.detached(command, folder / f"{sweep.name}.log")
