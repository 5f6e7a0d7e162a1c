#!/usr/bin/env python
"""Does ``python -m toolkit calibrate`` find the critical batch a full study finds?

The task: ``experiments/mlp_mnist1d.yaml`` (the MNIST-1D paper's MLP, 20,000 examples, SGD with
momentum), which the lab's default factor (``B_crit ≈ 2.8 x B_simple``) was not measured on.

* **The full study**: ``experiments/critical_batch.py --model mlp`` (7 batches x 5 rates x 2
  seeds, 70 runs, the held-out loss read every ~512/B steps), its rows in
  ``experiments/critical_batch_mlp/runs.csv``.
* **The calibration**: ``calibrate``'s default grid on the config (4 batches x 3 rates, 12
  runs of 5 epochs at the config's batch, more at larger ones, the held-out loss read after
  each epoch), once per seed in ``--seeds``, fitted at the study's target losses.
* **The default-factor probe**: ``probe`` (200 updates) on the same config, its ``B_simple``
  times the default factor 2.8 (1.6-4.1), as a user without a calibration is told.

Claim: each calibration's ``B_crit`` is within 1.5x of the study's at every target.

    .venv/bin/python experiments/calibrate_check.py --runs /tmp/calibrate-runs   # ~25 min

Writes ``experiments/calibrate_mlp/runs.csv`` (each calibration run's updates to each target)
and ``summary.csv`` (the table printed at the end, which docs/study.md quotes).
"""

from __future__ import annotations

import argparse
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
WITHIN = 1.5


def calibration_rows(seed: int, root: Path) -> tuple[pd.DataFrame, float]:
    """One calibration on ``seed``: its runs' updates to each target, and its runs' seconds."""
    config = load(CONFIG, [f"seed={seed}"])
    sweep = calibrate.grid(config)
    calibrate.calibrate(config, root, sweep=sweep, targets=TARGETS)
    seconds = sum(summary(run)["duration_s"] or 0 for run in cell_runs(sweep, root).values())
    rows = calibrate.at_targets(calibrate.runs_table(sweep, root), TARGETS)
    return rows.assign(calibration_seed=seed), seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, required=True, help="runs root for the runs")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()

    study = pd.read_csv(STUDY)
    truth = {t: critical_batch.fit(study[study.target == t]) for t in TARGETS}
    measured = [calibration_rows(seed, args.runs) for seed in args.seeds]
    runs = pd.concat([rows for rows, _ in measured], ignore_index=True)
    OUT.mkdir(parents=True, exist_ok=True)
    runs.to_csv(OUT / "runs.csv", index=False)

    probed = probe.probe(load(CONFIG), steps=200, runs_root=args.runs)
    factor, low, high = probe.CALIBRATION
    table = []
    for target in TARGETS:
        full = truth[target]
        for seed in args.seeds:
            rows = runs[(runs.calibration_seed == seed) & (runs.target == target)]
            found = critical_batch.fit(rows)
            ratio = found.b_crit / full.b_crit
            table.append(
                {
                    "target_loss": target,
                    "study_b_crit": round(full.b_crit),
                    "study_band": "–".join(f"{b:.0f}" for b in full.b_crit_band),
                    "calibration_seed": seed,
                    "calibrate_b_crit": round(found.b_crit),
                    "calibrate_band": "–".join(f"{b:.0f}" for b in found.b_crit_band),
                    "ratio_to_study": round(ratio, 2),
                    "within_1.5x": 1 / WITHIN <= ratio <= WITHIN,
                    "probe_default_factor": round(factor * probed.b_simple),
                    "probe_band": f"{low * probed.b_simple:.0f}–{high * probed.b_simple:.0f}",
                }
            )
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
        f"{max(calibrate_s) / 60:.1f} min of run time (under horovodrun, start-up included)"
    )
    print(f"probe: B_simple {probed.b_simple:.0f} (band {probed.band[0]:.0f}–{probed.band[1]:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
