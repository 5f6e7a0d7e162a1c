#!/usr/bin/env python
"""Does ``python -m toolkit calibrate`` find the critical batch a full study finds?

The task: ``experiments/mlp_mnist1d.yaml`` (the MNIST-1D paper's MLP, 20,000 examples, SGD with
momentum), which the lab's default factor (``probe.CALIBRATION``) was first measured without.

* **The full study**: ``experiments/critical_batch.py --model mlp`` (7 batches x 5 rates x 2
  seeds, 70 runs, the held-out loss read every ~512/B steps), its rows in
  ``experiments/critical_batch_mlp/runs.csv``.
* **The calibration**: ``calibrate``'s default grid on the config (4 batches x 3 rates, 12
  runs of 5 data epochs at the config's batch, more at larger ones, the held-out loss read 40
  times a run), once per seed in ``--seeds``, fitted at the study's target losses; with the
  config's rate rule (sqrt) and again with linear scaling.
* **The default-factor probe**: ``probe`` (200 updates) on the same config, its ``B_simple``
  times the default factor (``probe.CALIBRATION``; 2.8, 1.6-4.1, in the committed summary), as
  a user without a calibration is told.

Claim: each calibration's ``B_crit`` is within 1.5x of the study's at every target, both fitted
by ``calibrate``'s estimator (least squares of relative residuals); the ``plain_`` columns fit
both by plain least squares, the study's published estimator.

    .venv/bin/python experiments/calibrate_check.py --runs /tmp/calibrate-runs   # ~30 min

Writes ``experiments/calibrate_mlp/runs.csv`` (each calibration run's updates to each target)
and ``summary.csv`` (the table printed at the end, which docs/notes/study.md quotes).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from toolkit.config import load  # noqa: E402
from toolkit.launching import calibrate, probe  # noqa: E402
from toolkit.launching.sweep_results import cell_runs  # noqa: E402
from toolkit.runs.table import summary  # noqa: E402
from toolkit.scaling import critical_batch  # noqa: E402

CONFIG = ROOT / "experiments" / "mlp_mnist1d.yaml"
STUDY = ROOT / "experiments" / "critical_batch_mlp" / "runs.csv"
OUT = ROOT / "experiments" / "calibrate_mlp"
TARGETS = (1.4, 1.2, 1.0)
RULES = ("sqrt", "linear")  # the config's, and the one the study's best rates follow to 256
WITHIN = 1.5


def calibration_rows(rule: str, seed: int, root: Path) -> tuple[pd.DataFrame, float]:
    """One calibration with the config's rates scaled by ``rule``, on ``seed``: its runs'
    updates to each target, and its runs' seconds."""
    config = load(CONFIG, [f"seed={seed}", f"lr_scaling.rule={rule}"])
    sweep = calibrate.grid(config)
    calibrate.calibrate(config, root, sweep=sweep, targets=TARGETS)
    runs = cell_runs(sweep, root)  # every run of that sweep name: other seeds' cells too
    seconds = sum(summary(runs[cell.key])["duration_s"] or 0 for cell in sweep.cells)
    rows = calibrate.at_targets(calibrate.runs_table(sweep, root), TARGETS)
    return rows.assign(rule=rule, calibration_seed=seed), seconds


def band(values) -> str:
    """A 10–90% band as text."""
    return "–".join("inf" if math.isinf(v) else f"{v:.0f}" for v in values)


def count(value: float) -> float:
    """A batch size, rounded unless infinite."""
    return value if math.isinf(value) else round(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, required=True, help="runs root for the runs")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()

    study = pd.read_csv(STUDY)
    measured = [calibration_rows(rule, seed, args.runs) for rule in RULES for seed in args.seeds]
    runs = pd.concat([rows for rows, _ in measured], ignore_index=True)
    OUT.mkdir(parents=True, exist_ok=True)
    runs.to_csv(OUT / "runs.csv", index=False)

    probed = probe.probe(load(CONFIG), steps=200, runs_root=args.runs)
    factor, low, high = probe.CALIBRATION
    table = []
    for (rule, seed, target), rows in runs.groupby(["rule", "calibration_seed", "target"]):
        row = {"rule": rule, "target_loss": target, "calibration_seed": seed}
        for estimator, relative in (("", True), ("plain_", False)):
            full = critical_batch.fit(study[study.target == target], relative=relative)
            found = critical_batch.fit(rows, relative=relative)
            ratio = found.b_crit / full.b_crit
            row |= {
                f"{estimator}study_b_crit": round(full.b_crit),
                f"{estimator}study_band": band(full.b_crit_band),
                f"{estimator}calibrate_b_crit": count(found.b_crit),
                f"{estimator}calibrate_band": band(found.b_crit_band),
                f"{estimator}ratio_to_study": round(ratio, 2),
                f"{estimator}within_1.5x": 1 / WITHIN <= ratio <= WITHIN,
            }
        row["probe_default_factor"] = round(factor * probed.b_simple)
        row["probe_band"] = band((low * probed.b_simple, high * probed.b_simple))
        table.append(row)
    table = pd.DataFrame(table)
    table.to_csv(OUT / "summary.csv", index=False)
    print(table.to_string(index=False))
    study_s, calibrate_s = (
        study.drop_duplicates(["batch", "rate", "seed"]).wall_s.sum(),
        [s for _, s in measured],
    )
    print(
        f"\ncost: the study's 70 runs trained {study_s / 60:.1f} min (in one process, no "
        f"start-up); each calibration's 12 runs {min(calibrate_s) / 60:.1f}–"
        f"{max(calibrate_s) / 60:.1f} min of training (each run's start-up under horovodrun, "
        "about 13 s, on top)"
    )
    print(f"probe: B_simple {probed.b_simple:.0f} (band {probed.band[0]:.0f}–{probed.band[1]:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
