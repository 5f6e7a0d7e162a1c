#!/usr/bin/env python
"""Accuracy against communication: SINGA's DistOpt modes on the quickstart.

The quickstart (``experiments/quickstart.yaml``: MNIST-1D's 1-D CNN, LARS with warmup and
cosine decay, 2 workers x 32, 20 epochs) under every mode in ``MODES``, seeds 0-2, one run at a
time under horovodrun. For each run: the final test accuracy and the bytes a worker sent over
the whole run (``toolkit.curves.bytes_axis`` over its ``comm/bytes_sent`` events). The table
gives each mode's mean ± std over seeds, its accuracy against dense, and how many times fewer
bytes than dense it sent. The last two modes swap LARS for SGD with momentum (a diagnosis).

    .venv/bin/python experiments/comm_study.py             # ~30 minutes on 2 cores
    .venv/bin/python experiments/comm_study.py --smoke     # one seed, 2 epochs, 3 modes

Resumable: rows go to ``experiments/comm_study/runs.csv`` as runs finish, and a cell already
there is not run again (``--fresh`` starts over). The table is what ``docs/study.md`` quotes.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

RESULTS = ROOT / "experiments" / "comm_study" / "runs.csv"
SGD = [
    "optimizer.name=sgd",
    "optimizer.learning_rate=0.05",
    "optimizer.params={momentum: 0.9, weight_decay: 0.0001}",
]
SEEDS = (0, 1, 2)
MODES = {
    "dense": [],
    "topk 10%": ["allreduce.compression=topk", "allreduce.ratio=0.1"],
    "topk 1%": ["allreduce.compression=topk", "allreduce.ratio=0.01"],
    "topk 0.1%": ["allreduce.compression=topk", "allreduce.ratio=0.001"],
    "topk 10%, no residual": [
        "allreduce.compression=topk",
        "allreduce.ratio=0.1",
        "allreduce.residual=false",
    ],
    "topk 1%, no residual": [
        "allreduce.compression=topk",
        "allreduce.ratio=0.01",
        "allreduce.residual=false",
    ],
    "topk 0.1%, no residual": [
        "allreduce.compression=topk",
        "allreduce.ratio=0.001",
        "allreduce.residual=false",
    ],
    "threshold 0.01": ["allreduce.compression=threshold", "allreduce.threshold=0.01"],
    "partial (5 partitions)": ["sync.mode=partial", "allreduce.fusion_threshold_mb=0.005"],
    "local SGD H=4": ["sync.mode=local_sgd", "sync.period=4"],
    "local SGD H=16": ["sync.mode=local_sgd", "sync.period=16"],
    # a diagnosis: the same two settings with SGD + momentum instead of LARS (the rate of
    # notebook 04's SGD clone), to tell sparsity's cost from its interplay with trust ratios
    "dense, SGD": SGD,
    "topk 1%, SGD": [*SGD, "allreduce.compression=topk", "allreduce.ratio=0.01"],
}


def run_cell(mode: str, seed: int, epochs: int, root: str) -> dict:
    from toolkit import config as config_lib
    from toolkit import launch, monitor
    from toolkit.curves import bytes_axis
    from toolkit.events import read_events

    overrides = [*MODES[mode], f"seed={seed}", f"epochs={epochs}", "checkpoint.every_epochs=100"]
    config = config_lib.load(ROOT / "experiments" / "quickstart.yaml", overrides)
    run = launch.launch(config, runs_root_dir=root)
    state = monitor.follow(run, progress=False)["state"]
    events = read_events(run.events_path)
    evals = events[events["phase"] == "eval"]
    sent = bytes_axis(events, config.steps_per_update())
    return {
        "mode": mode,
        "seed": seed,
        "epochs": epochs,
        "state": state,
        "final_accuracy": float(evals["accuracy"].iloc[-1]) if len(evals) else float("nan"),
        "bytes_sent": float(sent.max()) if sent is not None else 0.0,
        "run_id": run.run_id,
    }


def table(rows: pd.DataFrame) -> str:
    """Mean ± std per mode, against dense."""
    grouped = rows.groupby("mode", sort=False)
    summary = grouped.agg(
        runs=("seed", "count"),
        accuracy=("final_accuracy", "mean"),
        spread=("final_accuracy", "std"),
        bytes_sent=("bytes_sent", "mean"),
    )
    dense = summary.loc["dense"] if "dense" in summary.index else None
    lines = [
        "| mode | runs | final test accuracy (mean ± std) | vs dense (points) | MB sent per worker "
        "| x fewer bytes than dense |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for mode, row in summary.iterrows():
        versus = "" if dense is None else f"{100 * (row.accuracy - dense.accuracy):+.1f}"
        fewer = (
            f"{dense.bytes_sent / row.bytes_sent:,.0f}"
            if dense is not None and row.bytes_sent > 0
            else "-"
        )
        spread = "-" if pd.isna(row.spread) else f"{100 * row.spread:.1f}"
        lines.append(
            f"| {mode} | {int(row.runs)} | {100 * row.accuracy:.1f}% ± {spread} "
            f"| {versus} | {row.bytes_sent / 1e6:,.2f} | {fewer} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="one seed, 2 epochs, 3 modes")
    parser.add_argument("--fresh", action="store_true", help="forget earlier rows")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    modes = ["dense", "topk 1%", "local SGD H=4"] if args.smoke else list(MODES)
    seeds, epochs = ((0,), 2) if args.smoke else (SEEDS, 20)
    done = pd.DataFrame()
    if args.results.exists() and not args.fresh:
        done = pd.read_csv(args.results)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as root:
        for seed in seeds:  # seeds outermost: an early stop leaves every mode with some runs
            for mode in modes:
                if (
                    len(done)
                    and (
                        (done["mode"] == mode) & (done["seed"] == seed) & (done["epochs"] == epochs)
                    ).any()
                ):
                    continue
                row = run_cell(mode, seed, epochs, root)
                print(
                    f"{mode}, seed {seed}: {row['state']}, accuracy {row['final_accuracy']:.3f}, "
                    f"{row['bytes_sent'] / 1e6:,.2f} MB sent",
                    flush=True,
                )
                done = pd.concat([done, pd.DataFrame([row])], ignore_index=True)
                done.to_csv(args.results, index=False)
    rows = done[(done["epochs"] == epochs) & done["mode"].isin(modes)]
    print(f"\nquickstart, 2 workers, {epochs} epochs, seeds {sorted(set(rows['seed']))}")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
