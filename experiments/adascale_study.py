#!/usr/bin/env python
"""Study v2's AdaScale tables: AdaScale against scale, beside the study's fixed-batch recipes,
and the adaptive batch against both.

    python -m toolkit --runs RUNS sweep experiments/study/adascale.yaml   # 18 runs
    python -m toolkit --runs RUNS sweep experiments/study/adaptive.yaml   # 6 runs
    python experiments/critical_batch.py                                  # the calibration
    python experiments/adascale_study.py --runs RUNS                      # this script

Per method and global batch, over the seeds: final test accuracy (mean ± std), the updates and
epochs each run took (outcomes: AdaScale ends when its clock has done the base run's 15 epochs),
the mean gain against its most, ``S``, wall time, and two step counts set against McCandlish et
al.'s model ``S(B) = S_min·(1 + B_crit/B)``:

* the steps to a test loss of 0.6, read from the per-epoch evaluations (linear in the log of
  the loss between the two that straddle it), against ``S(B)`` at the calibrated loss-0.6 fit
  of ``experiments/critical_batch/runs.csv`` (its steps are a fixed rate's, the best of a grid);
* the run's own updates, against the base run's 7,500 scaled by ``S(B)/S(32)``;

and the updates to the first evaluation within a point of the baseline's final accuracy.

The study's fixed-batch rows (``experiments/study/results.csv``) are shown beside them. Writes
``experiments/study/adascale.csv`` and ``adascale.md``. A sweep whose runs are not under
``--runs`` is read from its CSV of an earlier measurement.

The adaptive batch's table (``adaptive.csv``, ``adaptive.md``) gives, per largest batch, the same
outcomes, the batch each run ended at, and its updates to the baseline's accuracy against the
fewest any fixed-batch AdaScale run took: does growing the batch reach it in fewer updates?
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "experiments"):
    if str(path) not in sys.path:  # run as a script from anywhere
        sys.path.insert(0, str(path))

import critical_batch  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from toolkit import sweep  # noqa: E402
from toolkit.curves import updates_by_epoch  # noqa: E402
from toolkit.events import read_events  # noqa: E402
from toolkit.rundir import resolve  # noqa: E402

STUDY_DIR = ROOT / "experiments" / "study"
ADASCALE, ADAPTIVE = STUDY_DIR / "adascale.yaml", STUDY_DIR / "adaptive.yaml"
LABELS = {"adascale_sgd": "AdaScale SGD", "adascale_lars": "AdaScale LARS"}
FIXED = {  # the study's fixed-batch recipes shown beside AdaScale
    "sgd": "SGD baseline (B=32)",
    "sgd_linear_warmup": "SGD + linear scaling + warmup",
    "lars_sqrt": "LARS + sqrt scaling",
    "lbsgd_lars": "LBSGD lars",
}
NUM_TRAIN, BASE_BATCH, BASE_UPDATES = 16_000, 32, 15 * 16_000 // 32
TARGET_LOSS = 0.6
BASELINE = "sgd"  # the study's B=32 SGD run, whose final accuracy less a point is the target


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


def run_rows(sweep_file: Path, runs_root: Path | None, accuracy: float) -> pd.DataFrame:
    """One row per ended run of ``sweep_file``: its cell, outcome, updates, epochs, mean gain,
    updates to the target loss and to the first evaluation at ``accuracy`` or better. An
    adaptive batch's row has its largest batch as ``global_batch`` and the batch it ended at;
    its updates are counted epoch by epoch, at the batch each evaluation says it had."""
    table = sweep.results(sweep.load(sweep_file), runs_root)
    rows = []
    for cell in table.to_dict("records"):
        if cell["state"] not in ("completed", "failed", "stopped"):
            continue  # not ended yet
        events = read_events(resolve(cell["run_id"], runs_root).events_path)
        train, evals = events[events.phase == "train"], events[events.phase == "eval"].copy()
        batch = int(cell["global_batch"])
        row, step_batch = {"global_batch": batch, "scale": batch / BASE_BATCH}, batch
        evals["updates"] = evals.step  # a step per update: one worker, no accumulation
        if "global_batch" in evals:  # adaptive (adaptive.yaml): every step takes 32 examples
            step_batch = BASE_BATCH
            evals["updates"] = updates_by_epoch(evals, step_batch)
            row = {"global_batch": cell["batch.adaptive.max"], "smallest": batch}
            row["final_batch"] = int(evals.global_batch.iloc[-1])
        rows.append(
            {
                "method": cell["method"],
                **row,
                "seed": cell["seed"],
                "final_test_accuracy": cell["final_test_accuracy"],
                "updates": round(evals.updates.iloc[-1]),
                "epochs": train.step.max() * step_batch / NUM_TRAIN,
                "mean_gain": train.gain.mean(),
                "steps_to_loss": steps_to_loss(evals.assign(step=evals.updates), TARGET_LOSS),
                "steps_to_accuracy": evals.updates[evals.accuracy >= accuracy].min(),
                "wall_s": cell["wall_s"],
            }
        )
    return pd.DataFrame(rows)


def pm(values: pd.Series, scale: float = 1, digits: int = 0) -> str:
    """``mean ± std`` of ``values`` times ``scale`` (the mean alone for one, — for none)."""
    values = values.dropna() * scale
    if not len(values):
        return "—"
    spread = f" ± {values.std(ddof=1):.{digits}f}" if len(values) > 1 else ""
    return f"{values.mean():.{digits}f}{spread}"


def table(rows: pd.DataFrame, fixed: pd.DataFrame, fit: dict, accuracy: float) -> str:
    """The markdown table, AdaScale's rows and the fixed recipes' at the same batches."""
    s_min, b_crit = fit["s_min"], fit["b_crit"]

    def predicted(batch):
        return s_min * (1 + b_crit / batch)

    lines = [
        f"| method | global batch | final test acc. % | updates | epochs | mean gain (of S) | "
        f"steps to test loss {TARGET_LOSS} (model) | updates vs model | "
        f"updates to {100 * accuracy:.1f}% | wall s |",
        "|---" * 10 + "|",
    ]
    for (method, batch), part in rows.groupby(["method", "global_batch"], sort=False):
        steps = part.steps_to_loss
        whole = BASE_UPDATES * predicted(batch) / predicted(BASE_BATCH)
        lines.append(
            f"| {LABELS[method]} | {batch:,} | {pm(part.final_test_accuracy, 100, 1)} | "
            f"{pm(part.updates, 1, 0)} | {pm(part.epochs, 1, 0)} | "
            f"{part.mean_gain.mean():.1f} (of {batch // BASE_BATCH}) | "
            f"{pm(steps, 1, 0)} ({predicted(batch):.0f}; ×{steps.mean() / predicted(batch):.2f}) | "
            f"×{part.updates.mean() / whole:.2f} of {whole:,.0f} | "
            f"{pm(part.steps_to_accuracy, 1, 0)} ({part.steps_to_accuracy.notna().sum()}/"
            f"{len(part)} reached) | {part.wall_s.mean():.0f} |"
        )
    for (method, batch), part in fixed.groupby(["method", "global_batch"], sort=False):
        lines.append(
            f"| {FIXED[method]} | {batch:,} | {pm(part.final_test_accuracy, 100, 1)} | "
            f"{part.updates.max():,.0f} | 15 | — | — | — | — | {part.wall_s.mean():.0f} |"
        )
    return "\n".join(lines)


def adaptive_table(rows: pd.DataFrame, fixed: pd.DataFrame, accuracy: float) -> str:
    """The adaptive batch's markdown table, per largest batch, against the fewest updates to
    ``accuracy`` any fixed batch of AdaScale SGD (``fixed``) took."""
    means = fixed[fixed.method == "adascale_sgd"].groupby("global_batch").steps_to_accuracy.mean()
    fewest, at = means.min(), means.idxmin()

    lines = [
        f"| method | global batch | final test acc. % | updates | epochs | ended at batch | "
        f"mean gain | updates to test loss {TARGET_LOSS} | updates to {100 * accuracy:.1f}% "
        f"(fewest fixed: {fewest:.0f} at {at:,}) | wall s |",
        "|---" * 10 + "|",
    ]
    for (smallest, largest), part in rows.groupby(["smallest", "global_batch"]):
        reached = part.steps_to_accuracy
        lines.append(
            f"| Adaptive SGD | {smallest:,} to {largest:,} | "
            f"{pm(part.final_test_accuracy, 100, 1)} | "
            f"{pm(part.updates)} | {pm(part.epochs)} | "
            f"{', '.join(map(str, part.final_batch))} | {part.mean_gain.mean():.1f} | "
            f"{pm(part.steps_to_loss)} | {pm(reached)} (×{reached.mean() / fewest:.2f}; "
            f"{reached.notna().sum()}/{len(part)} reached) | {part.wall_s.mean():.0f} |"
        )
    return "\n".join(lines)


def measured(sweep_file: Path, runs_root: Path | None, accuracy: float, out: Path):
    """The rows of ``sweep_file``'s runs under ``runs_root``, written to ``out/<name>.csv``;
    that file's rows where none of its runs is there (an earlier measurement)."""
    rows = run_rows(sweep_file, runs_root, accuracy)
    path = out / f"{sweep_file.stem}.csv"
    if rows.empty:
        return pd.read_csv(path)
    out.mkdir(parents=True, exist_ok=True)
    rows.to_csv(path, index=False)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, help="the runs root of the sweep (default $LBL_RUNS)")
    parser.add_argument("--out", type=Path, default=STUDY_DIR, help="results folder")
    args = parser.parse_args(argv)

    study = pd.read_csv(STUDY_DIR / "results.csv")
    accuracy = study[study.method == BASELINE].final_test_accuracy.mean() - 0.01
    rows = measured(ADASCALE, args.runs, accuracy, args.out)
    adaptive = measured(ADAPTIVE, args.runs, accuracy, args.out)
    calibration = pd.read_csv(ROOT / "experiments" / "critical_batch" / "runs.csv")
    if "target" not in calibration:  # written before it measured several targets: 0.6 alone
        calibration["target"] = TARGET_LOSS
    fit = critical_batch.measure(calibration[calibration.target == TARGET_LOSS])
    batches = set(rows.global_batch) | {BASE_BATCH}
    fixed = study[study.method.isin(FIXED) & study.global_batch.isin(batches)]
    fixed = fixed[(fixed.method != "lars_sqrt") | (fixed.global_batch > BASE_BATCH)]
    shown = table(rows, fixed, fit, accuracy)
    said = (
        f"McCandlish's model at test loss {TARGET_LOSS}: S_min = {fit['s_min']:.0f}, "
        f"B_crit = {fit['b_crit']:.0f} ({fit['b_crit_band'][0]:.0f}–{fit['b_crit_band'][1]:.0f})"
    )
    grown = adaptive_table(adaptive, rows, accuracy)
    print(shown, "\n\n" + said + "\n\n" + grown)
    (args.out / "adascale.md").write_text(shown + "\n\n" + said + "\n")
    (args.out / "adaptive.md").write_text(grown + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
