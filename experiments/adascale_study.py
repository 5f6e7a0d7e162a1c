#!/usr/bin/env python
"""Study v2's tables: AdaScale and the adaptive batch against scale, beside fixed-batch
recipes, on two tasks.

    python -m toolkit --runs RUNS sweep experiments/study/adascale.yaml   # first task: 18 runs
    python -m toolkit --runs RUNS sweep experiments/study/adaptive.yaml   # first task: 9 runs
    python -m toolkit --runs RUNS sweep experiments/study/adaptive_v2.yaml   # revisited: 9 runs
    python -m toolkit --runs RUNS sweep experiments/study/adaptive_v3.yaml   # 2 workers: 12
    python -m toolkit --runs RUNS sweep experiments/study/scale_80k.yaml  # second task: 51 runs
    python experiments/critical_batch.py [...]                            # each calibration
    python experiments/adascale_study.py --runs RUNS                      # this script

The first task is the study's MNIST-1D 20k (16,000 training examples, baseline B=32 for 15
epochs, steps counted to test loss 0.6); the second is MNIST-1D 80k (64,000, 8 epochs, test loss
0.3), chosen because its measured noise scale puts ``B_crit`` above 32x its baseline batch.

Per method and global batch, over the seeds: final test accuracy (mean ± std), the updates and
epochs each run took (outcomes: AdaScale ends when its clock has done the base run's updates),
the mean gain against its most, ``S``, wall time, and two step counts set against McCandlish et
al.'s model ``S(B) = S_min·(1 + B_crit/B)``:

* the steps to the task's test loss, read from the per-epoch evaluations (linear in the log of
  the loss between the two that straddle it), against ``S(B)`` at the task's calibrated fit at
  that loss (its steps are a fixed rate's, the best of a grid);
* the run's own updates, against the base run's scaled by ``S(B)/S(32)``;

and the updates to the first evaluation within a point of the baseline's final accuracy.

The first task's fixed-batch rows come from the study (``experiments/study/results.csv``); the
second task's from its own sweep. Writes ``adascale.md``, ``adaptive.md`` and ``scale_80k.md``
with their rows (``.csv``) under ``--out``. A sweep whose runs are not under ``--runs`` is read
from its CSV of an earlier measurement.

The adaptive batch's table gives, per largest batch, the same outcomes, the batch each run ended
at, and its updates to the baseline's accuracy against the fewest any fixed-batch AdaScale run
took: does growing the batch reach it in fewer updates?
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "experiments"):
    if str(path) not in sys.path:  # run as a script from anywhere
        sys.path.insert(0, str(path))

import critical_batch  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from toolkit.launching import sweep, sweep_results  # noqa: E402
from toolkit.plan import Scale  # noqa: E402
from toolkit.runs.curves import updates_by_epoch  # noqa: E402
from toolkit.runs.events import read_events  # noqa: E402
from toolkit.runs.rundir import resolve  # noqa: E402
from toolkit.scaling import critical_batch as mccandlish  # noqa: E402

STUDY_DIR = ROOT / "experiments" / "study"
LABELS = {
    "sgd": "SGD baseline (B=32)",
    "sgd_linear_warmup": "SGD + linear scaling + warmup",
    "lars_sqrt": "LARS + sqrt scaling",
    "lbsgd_lars": "LBSGD lars",
    "adascale_sgd": "AdaScale SGD",
    "adascale_lars": "AdaScale LARS",
    "adaptive_sgd": "Adaptive SGD",
    "adaptive_aim": "Adaptive SGD, aim 3.5",
    "adaptive_steady": "Adaptive SGD, hysteresis 0.5, measured on 128",
    "adaptive_aim_steady": "Adaptive SGD, all three",
    "fixed": "AdaScale SGD, fixed",
    "adaptive": "Adaptive SGD, aim and hysteresis from the noise scale",
}
ADASCALE_METHODS = ("adascale_sgd", "adascale_lars")
BASE_BATCH = 32
BASELINE = "sgd"  # the task's B=32 SGD run, whose final accuracy less a point is the target


@dataclass(frozen=True)
class Task:
    """One study task: its training-set size, its B=32 baseline's updates and epochs, the test
    loss its steps are counted to, and its calibration runs (``critical_batch.py``)."""

    num_train: int
    base_updates: int
    epochs: int
    target_loss: float
    calibration: Path


FIRST = Task(16_000, 7_500, 15, 0.6, ROOT / "experiments" / "critical_batch" / "runs.csv")
SECOND = Task(64_000, 16_000, 8, 0.3, ROOT / "experiments" / "critical_batch_80k" / "runs.csv")


def steps_to_loss(evals: pd.DataFrame, target: float) -> float:
    """The step at which the test loss first reaches ``target``, interpolated linearly in the
    log of the loss between the evaluations on either side (``nan`` if never)."""
    losses, steps = evals["loss"].to_numpy(), evals["step"].to_numpy(float)
    below = np.flatnonzero(losses <= target)
    if not len(below):
        return math.nan
    i = below[0]
    if i == 0:
        return steps[0]
    low, high = np.log(losses[i]), np.log(losses[i - 1])
    return steps[i - 1] + (steps[i] - steps[i - 1]) * (high - np.log(target)) / (high - low)


def target_accuracy(runs: pd.DataFrame) -> float:
    """The baseline's mean final test accuracy less a point (runs that did not complete have
    none, and do not count)."""
    return runs[runs.method == BASELINE].final_test_accuracy.mean() - 0.01


def run_rows(task: Task, sweep_file: Path, runs_root: Path | None, accuracy: float | None):
    """One row per ended run of ``sweep_file``: its cell, outcome, updates, epochs, mean gain,
    updates to the task's target loss and to the first evaluation at ``accuracy`` or better
    (``None``: the sweep's own baseline's final accuracy less a point).
    An adaptive batch's row has its largest batch as ``global_batch`` and the batch it ended
    at; its updates are counted epoch by epoch, at the batch each evaluation says it had."""
    plan = sweep.load(sweep_file)
    results = sweep_results.results(plan, runs_root)
    if accuracy is None:  # the baseline is in this sweep
        accuracy = target_accuracy(results)
    rows = []
    for spec, cell in zip(plan.cells, results.to_dict("records"), strict=True):
        if cell["state"] not in ("completed", "failed", "stopped"):
            continue  # not ended yet
        events = read_events(resolve(cell["run_id"], runs_root).events_path)
        train, evals = events[events.phase == "train"], events[events.phase == "eval"].copy()
        batch, per_update = int(cell["global_batch"]), Scale.of(spec.config).steps_per_update
        step_batch = batch // per_update  # examples per step (LBSGD: its device batch)
        row = {"global_batch": batch, "scale": batch / BASE_BATCH}
        adaptive = "global_batch" in evals  # every step takes the same examples
        evals["updates"] = (
            updates_by_epoch(evals, step_batch) if adaptive else evals.step / per_update
        )
        first = evals[evals.accuracy >= accuracy].head(1)  # the first evaluation at the target
        if adaptive:
            row = {"global_batch": spec.config.batch.adaptive.max, "smallest": batch}
            row["final_batch"] = int(evals.global_batch.iloc[-1])
            changed = evals.global_batch.diff().fillna(0) != 0
            row["batch_changes"] = int(changed.sum())
            moves = evals[changed][["epoch", "global_batch"]].to_numpy()
            row["changes"] = " ".join(f"{int(e)}:{int(b)}" for e, b in moves)  # epoch:batch
            before = train[train.step <= first.step.min()].tail(1)  # at the target: its batch,
            row["batch_at_target"] = first.global_batch.min()  # and the B_simple the rule read
            row["b_simple_at_target"] = b_simple_of_gain(
                before.gain.sum(), BASE_BATCH, before.global_batch.sum()
            )
        rows.append(
            {
                "method": cell["method"],
                **row,
                "seed": cell["seed"],
                "final_test_accuracy": cell["final_test_accuracy"],
                "diverged": cell["diverged"],
                "updates": round(evals.updates.iloc[-1]),
                "epochs": train.step.max() * step_batch / task.num_train,
                "mean_gain": train.gain.mean() if "gain" in train else math.nan,
                "steps_to_loss": steps_to_loss(evals.assign(step=evals.updates), task.target_loss),
                "steps_to_accuracy": first.updates.min(),
                "epochs_to_accuracy": first.step.min() * step_batch / task.num_train,
                "seconds_to_accuracy": first.wall.min() - events.wall.min(),
                "wall_s": cell["wall_s"],
            }
        )
    return pd.DataFrame(rows)


def b_simple_of_gain(gain: float, base_batch: int, batch: int) -> float:
    """The smoothed ``B_simple`` AdaScale's ``gain = (1 + B/B0) / (1 + B/batch)`` was computed
    from, solved for ``B`` (the one the adaptive batch's rule reads; a train event logs the
    gain, not it)."""
    return (gain - 1) / (1 / base_batch - gain / batch) if gain else math.nan


def pm(values: pd.Series, scale: float = 1, digits: int = 0) -> str:
    """``mean ± std`` of ``values`` times ``scale`` (the mean alone for one, — for none)."""
    values = values.dropna() * scale
    if not len(values):
        return "—"
    spread = f" ± {values.std(ddof=1):.{digits}f}" if len(values) > 1 else ""
    return f"{values.mean():.{digits}f}{spread}"


def table(
    task: Task, rows: pd.DataFrame, fixed: pd.DataFrame, fit: mccandlish.TargetFit, accuracy: float
):
    """The markdown table, AdaScale's rows and the fixed recipes' at the same batches."""
    s_min, b_crit = fit.s_min, fit.b_crit

    def predicted(batch):
        return s_min * (1 + b_crit / batch)

    lines = [
        f"| method | global batch | final test acc. % | updates | epochs | mean gain (of S) | "
        f"steps to test loss {task.target_loss} (model) | updates vs model | "
        f"updates to {100 * accuracy:.1f}% | wall s |",
        "|---" * 10 + "|",
    ]
    for (method, batch), part in rows.groupby(["method", "global_batch"], sort=False):
        steps = part.steps_to_loss
        whole = task.base_updates * predicted(batch) / predicted(BASE_BATCH)
        lines.append(
            f"| {LABELS[method]} | {batch:,} | {accuracy_of(part)} | "
            f"{pm(part.updates)} | {pm(part.epochs)} | "
            f"{part.mean_gain.mean():.1f} (of {batch // BASE_BATCH}) | "
            f"{pm(steps)} ({ratio(steps.mean(), predicted(batch))}model {predicted(batch):.0f}) | "
            f"×{part.updates.mean() / whole:.2f} of {whole:,.0f} | {reached(part)} | "
            f"{part.wall_s.mean():.0f} |"
        )
    for (method, batch), part in fixed.groupby(["method", "global_batch"], sort=False):
        known = "steps_to_accuracy" in part  # the first task's study did not record them
        to_loss = f"{pm(part.steps_to_loss)} (model {predicted(batch):.0f})" if known else "—"
        lines.append(
            f"| {LABELS[method]} | {batch:,} | {accuracy_of(part)} | "
            f"{part.updates.max():,.0f} | {task.epochs} | — | {to_loss} | — | "
            f"{reached(part) if known else '—'} | "
            f"{part.wall_s.mean():.0f} |"
        )
    return "\n".join(lines)


def ratio(value: float, of: float) -> str:
    """``×value/of; ``, or nothing where ``value`` is not known."""
    return "" if math.isnan(value) else f"×{value / of:.2f}; "


def accuracy_of(part: pd.DataFrame) -> str:
    """The final test accuracy in % over the runs that completed, and how many diverged."""
    diverged = part.diverged.sum() if "diverged" in part else 0
    return pm(part.final_test_accuracy, 100, 1) + (f" ({diverged} diverged)" if diverged else "")


def reached(part: pd.DataFrame) -> str:
    """The updates to the target accuracy over the runs that reached it, and how many did."""
    steps = part.steps_to_accuracy
    return f"{pm(steps)} ({steps.notna().sum()}/{len(part)} reached)"


def adaptive_table(task: Task, rows: pd.DataFrame, fixed: pd.DataFrame, accuracy: float) -> str:
    """The adaptive batch's markdown table, per largest batch, against the fewest updates to
    ``accuracy`` any fixed batch of AdaScale SGD (``fixed``) took."""
    means = fixed[fixed.method == "adascale_sgd"].groupby("global_batch").steps_to_accuracy.mean()
    fewest, at = means.min(), means.idxmin()

    lines = [
        f"| method | global batch | final test acc. % | updates | epochs | ended at batch | "
        f"mean gain | updates to test loss {task.target_loss} | updates to {100 * accuracy:.1f}% "
        f"(fewest fixed: {fewest:.0f} at {at:,}) | wall s |",
        "|---" * 10 + "|",
    ]
    for (method, smallest, largest), part in rows.astype({"smallest": int}).groupby(
        ["method", "smallest", "global_batch"], sort=False
    ):
        steps = part.steps_to_accuracy
        lines.append(
            f"| {LABELS[method]} | {smallest:,} to {largest:,} | {accuracy_of(part)} | "
            f"{pm(part.updates)} | {pm(part.epochs)} | "
            f"{', '.join(str(int(b)) for b in part.final_batch)} | {part.mean_gain.mean():.1f} | "
            f"{pm(part.steps_to_loss)} | {pm(steps)} ({ratio(steps.mean(), fewest)}"
            f"{steps.notna().sum()}/{len(part)} reached) | {part.wall_s.mean():.0f} |"
        )
    return "\n".join(lines)


def against_fixed(rows: pd.DataFrame, accuracy: float) -> str:
    """The adaptive batch against each fixed batch of the same sweep: updates, epochs and
    seconds to ``accuracy`` (over the runs that reached it), and which fixed batch took the
    fewest updates and the fewest seconds."""
    fixed = rows[rows.method == "fixed"].groupby("global_batch")
    fewest = {
        what: (fixed[column].mean().min(), fixed[column].mean().idxmin())
        for what, column in (("updates", "steps_to_accuracy"), ("seconds", "seconds_to_accuracy"))
    }
    lines = [
        f"| method | global batch | final test acc. % | updates | epochs | ended at batch "
        f"(changes) | updates to {100 * accuracy:.1f}% | epochs to it | seconds to it | wall s |",
        "|---" * 10 + "|",
    ]
    for (method, largest), part in rows.groupby(["method", "global_batch"], sort=False):
        adaptive = method == "adaptive"
        batch = f"{int(part.smallest.iloc[0]):,} to {largest:,}" if adaptive else f"{largest:,}"
        ended = (
            ", ".join(
                f"{int(b)} ({int(n)})"
                for b, n in zip(part.final_batch, part.batch_changes, strict=True)
            )
            if adaptive
            else "—"
        )
        lines.append(
            f"| {LABELS[method]} | {batch} | {accuracy_of(part)} | {pm(part.updates)} | "
            f"{pm(part.epochs)} | {ended} | "
            f"{reached(part)} | {pm(part.epochs_to_accuracy, digits=1)} | "
            f"{pm(part.seconds_to_accuracy)} | {pm(part.wall_s)} |"
        )
    lines.append(
        "\nfewest of a fixed batch: "
        + "; ".join(f"{what} {value:,.0f} at {at:,}" for what, (value, at) in fewest.items())
    )
    return "\n".join(lines)


def measured(path: Path, measure) -> pd.DataFrame:
    """``measure()``'s rows, written to ``path``; that file's rows where it finds none (the
    runs are not under ``--runs``: an earlier measurement)."""
    rows = measure()
    if rows.empty:
        return pd.read_csv(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows.to_csv(path, index=False)
    return rows


def calibrated(task: Task) -> mccandlish.TargetFit:
    """McCandlish's fit at the task's target loss, from its calibration runs."""
    calibration = pd.read_csv(task.calibration)
    if "target" not in calibration:  # written before it measured several targets: 0.6 alone
        calibration["target"] = task.target_loss
    rows = calibration[calibration.target == task.target_loss]
    return mccandlish.fit(rows, relative=False)  # the published tables' plain least squares


def fitted(task: Task, fit: mccandlish.TargetFit) -> str:
    low, high = fit.b_crit_band
    return (
        f"McCandlish's model at test loss {task.target_loss}: S_min = {fit.s_min:.0f}, "
        f"B_crit = {fit.b_crit:.0f} ({low:.0f}–{high:.0f})"
    )


def first_task(runs: Path | None, out: Path) -> str:
    """AdaScale's and the adaptive batch's tables on the first task (the adaptive batch as
    study v2 ran it, revisited, and against fixed batches on 2 workers), beside the study's
    fixed-batch recipes; written to ``adascale.md``, ``adaptive.md`` and ``adaptive_v3.md``."""
    study = pd.read_csv(STUDY_DIR / "results.csv")
    accuracy = target_accuracy(study)
    rows, adaptive, revisited, two_workers = (
        measured(
            out / f"{name}.csv",
            lambda n=name: run_rows(FIRST, STUDY_DIR / f"{n}.yaml", runs, accuracy),
        )
        for name in ("adascale", "adaptive", "adaptive_v2", "adaptive_v3")
    )
    batches = set(rows.global_batch) | {BASE_BATCH}
    fixed = study[study.method.isin(LABELS) & study.global_batch.isin(batches)]
    fixed = fixed[(fixed.method != "lars_sqrt") | (fixed.global_batch > BASE_BATCH)]
    fit = calibrated(FIRST)
    shown = table(FIRST, rows, fixed, fit, accuracy) + "\n\n" + fitted(FIRST, fit)
    grown = adaptive_table(FIRST, pd.concat([adaptive, revisited]), rows, accuracy)
    versus = against_fixed(two_workers, accuracy)
    (out / "adascale.md").write_text(shown + "\n")
    (out / "adaptive.md").write_text(grown + "\n")
    (out / "adaptive_v3.md").write_text(versus + "\n")
    return shown + "\n\n" + grown + "\n\n" + versus


def second_task(runs: Path | None, out: Path) -> str:
    """Every recipe against scale on the second task, the adaptive batch, and ``B_simple``
    through its baseline; written to ``scale_80k.md``."""
    sweep_file = STUDY_DIR / "scale_80k.yaml"
    rows = measured(out / "scale_80k.csv", lambda: run_rows(SECOND, sweep_file, runs, None))
    noise = measured(out / "scale_80k_noise.csv", lambda: baseline_noise(sweep_file, runs))
    accuracy = target_accuracy(rows)
    scaled = rows.method.isin(ADASCALE_METHODS)
    adaptive = rows.method == "adaptive_sgd"
    fit = calibrated(SECOND)
    shown = "\n\n".join(
        [
            table(SECOND, rows[scaled], rows[~scaled & ~adaptive], fit, accuracy),
            fitted(SECOND, fit),
            adaptive_table(SECOND, rows[adaptive], rows[scaled], accuracy),
            critical_batch.b_simple_table(noise),
        ]
    )
    (out / "scale_80k.md").write_text(shown + "\n")
    return shown


def baseline_noise(sweep_file: Path, runs: Path | None) -> pd.DataFrame:
    """``B_simple`` epoch by epoch over the baseline runs' own ``gns`` events."""
    table = sweep_results.results(sweep.load(sweep_file), runs)
    done = table[(table.method == BASELINE) & (table.state == "completed")]
    events = [read_events(resolve(run_id, runs).events_path) for run_id in done.run_id]
    return critical_batch.b_simple_by_epoch(events) if events else pd.DataFrame()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, help="the runs root of the sweeps (default $LBL_RUNS)")
    parser.add_argument("--out", type=Path, default=STUDY_DIR, help="results folder")
    args = parser.parse_args(argv)
    print(first_task(args.runs, args.out), "\n\n" + second_task(args.runs, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
