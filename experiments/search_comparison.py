"""Grid, TPE, or TPE with ASHA: which finds a good recipe for less compute? The quickstart task
(MNIST-1D's 1-D CNN, LARS, 1 worker of 32, 6 epochs: 750 updates, 24,000 examples a run) over
its learning rate, momentum and warm-up, 9 runs per method, 3 seeds per method, 2 runs at a
time on this machine.

    python experiments/search_comparison.py [--runs DIR] [--seeds 0 1 2] [--target 0.7]

- grid: 3 rates x 3 momenta at 1 warm-up epoch (a sweep; its seed is the runs' seed);
- tpe: 9 trials of Optuna's TPE over the same ranges (and warm-up 0 to 2 epochs), no pruning;
- tpe+asha: the same with Optuna's ASHA pruner reading each trial's eval events.

A run's cost is its CPU time: its wall time from taking its slot to its end (start-up
included) times its workers. For each method and seed: the best final test accuracy (higher
is better), the CPU-minutes spent in all, and the CPU-minutes spent, in the order runs ended,
until the first run at or above ``--target``. Every run's row goes to
``experiments/search_comparison.csv``; a runs root already there is read, not run again.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from toolkit.config import read_file
from toolkit.launching import search, search_runner, sweep, sweep_runner
from toolkit.runs.events import read_events
from toolkit.runs.rundir import RunDir

HERE = Path(__file__).parent
RATES = {"low": 0.1, "high": 5.0, "log": True}
MOMENTA = {"low": 0.8, "high": 0.99}
SHORT = {"workers": 1, "epochs": 6, "checkpoint": {"every_epochs": 6}}


def base(seed: int) -> dict:
    raw = read_file(HERE / "quickstart.yaml") | SHORT | {"seed": seed}
    raw.pop("name")
    return raw


def grid_runs(seed: int, root: Path) -> list[RunDir]:
    found = sweep.from_mapping(
        {
            "name": f"grid-s{seed}",
            "base": base(seed),
            "grid": {
                "optimizer.learning_rate": [0.2, 1.0, 5.0],
                "optimizer.params.momentum": [0.8, 0.9, 0.99],
            },
        }
    )
    table = sweep_runner.run(found, root, max_parallel=2, log=lambda line: None)
    return [RunDir(root / run_id) for run_id in table["run_id"]]


def search_runs(seed: int, pruner: str, root: Path) -> list[RunDir]:
    found = search.from_mapping(
        {
            "name": f"{'asha' if pruner == 'asha' else 'tpe'}-s{seed}",
            "base": base(seed),
            "space": {
                "optimizer.learning_rate": RATES,
                "optimizer.params.momentum": MOMENTA,
                "schedule.warmup.epochs": {"low": 0, "high": 2},
            },
            "trials": 9,
            "sampler": "tpe",
            "pruner": pruner,
            "seed": seed,
        }
    )
    table = search_runner.run(found, root, max_parallel=2, log=lambda line: None)
    return [RunDir(root / run_id) for run_id in table["run_id"].dropna()]


def row(run: RunDir, method: str, seed: int) -> dict:
    status, events = run.status(), read_events(run.events_path)
    evals = events[events.phase == "eval"] if "phase" in events else events
    return {
        "method": method,
        "seed": seed,
        "run_id": run.run_id,
        "state": status["state"],
        "evaluations": len(evals),
        "final_accuracy": float(evals.accuracy.iloc[-1]) if len(evals) else None,
        "ended": status["finished"],
        "cpu_s": round((status["finished"] - status["launched"]) * run.config().workers, 1),
    }


def summary(rows: pd.DataFrame, target: float) -> pd.DataFrame:
    """Per method and seed: best accuracy of a completed run, CPU-minutes in all and to the
    first completed run at or above ``target`` (in the order runs ended); then mean ± std."""
    per_seed = []
    for (method, seed), runs in rows.sort_values("ended").groupby(["method", "seed"]):
        spent = runs.cpu_s.cumsum() / 60
        hit = (runs.state == "completed") & (runs.final_accuracy >= target)
        per_seed.append(
            {
                "method": method,
                "seed": seed,
                "runs": len(runs),
                "pruned": int((runs.state == "pruned").sum()),
                "best_accuracy": runs[runs.state == "completed"].final_accuracy.max(),
                "cpu_min": spent.iloc[-1],
                "cpu_min_to_target": spent[hit].iloc[0] if hit.any() else float("nan"),
            }
        )
    table = pd.DataFrame(per_seed)
    shown = table.groupby("method", sort=False).agg(
        seeds=("seed", "count"),
        pruned=("pruned", "sum"),
        best_accuracy=("best_accuracy", lambda s: f"{s.mean():.3f} ± {s.std():.3f}"),
        cpu_min=("cpu_min", lambda s: f"{s.mean():.1f} ± {s.std():.1f}"),
        reached=("cpu_min_to_target", lambda s: f"{s.notna().sum()} of {len(s)}"),
        cpu_min_to_target=("cpu_min_to_target", lambda s: f"{s.mean():.1f} ± {s.std():.1f}"),
    )
    return shown.reset_index()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=HERE.parent / "runs-search-comparison")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--target", type=float, default=0.7)
    args = parser.parse_args()
    rows = []
    for seed in args.seeds:
        for method, runs in (
            ("grid", lambda s: grid_runs(s, args.runs)),
            ("tpe", lambda s: search_runs(s, "none", args.runs)),
            ("tpe+asha", lambda s: search_runs(s, "asha", args.runs)),
        ):
            rows += [row(run, method, seed) for run in runs(seed)]
            print(f"seed {seed}: {method} done", flush=True)
    table = pd.DataFrame(rows)
    table.to_csv(HERE / "search_comparison.csv", index=False)
    print(f"target: final test accuracy >= {args.target} (higher is better)")
    print(summary(table, args.target).to_string(index=False))


if __name__ == "__main__":
    main()
