#!/usr/bin/env python
"""Accuracy against communication: SINGA's DistOpt modes, MXNet's 2bit and Deep Gradient
Compression on two tasks.

Tasks (``--task``): ``quickstart`` (``experiments/quickstart.yaml``: MNIST-1D's 1-D CNN, LARS
with warmup and cosine decay, 2 workers x 32, 20 epochs) and ``resnet20``
(``experiments/resnet20_digits.yaml``: ResNet-20 on the 8x8 digits, SGD with momentum 0.9, 2
workers x 32, 10 epochs, where dense is at 99%). Studies (``--study``): ``distopt``, SINGA's
modes (``MODES``; the quickstart only); ``dgc``, topk 1% and 0.1% with and without DGC's
techniques (at 0.1%, the preset less one technique at a time), 2bit at two thresholds and topk
with float16 values (``DGC_MODES``; with LARS, also its trust ratio from the dense norm);
``cross``, dense, topk 1% and DGC's topk 1% with each task's optimizer swapped (SGD on the
quickstart, the quickstart's LARS on ResNet-20: ``CROSS``), to tell LARS's part in the
quickstart's loss under compression from its small model's. Seeds
0-2, one run at a time under horovodrun. For each run: the final test accuracy, the bytes a
worker sent over the whole run (``toolkit.runs.curves.bytes_axis`` over its ``comm/bytes_sent``
events), and the updates and seconds to the dense runs' mean final accuracy less a point. The
table gives each mode's mean ± std over seeds, against dense, and how many times fewer bytes
than dense it sent.

    .venv/bin/python experiments/comm_study.py                          # distopt, ~30 min
    .venv/bin/python experiments/comm_study.py --study dgc --task resnet20
    .venv/bin/python experiments/comm_study.py --study cross --task quickstart  # SGD there
    .venv/bin/python experiments/comm_study.py --study dgc --modes "dense;topk 1%, DGC" \
        --seeds 0 --runs /tmp/tr --results /tmp/tr.csv       # LARS runs kept, then their
    .venv/bin/python experiments/comm_study.py --trust-ratios --runs /tmp/tr  # trust ratios
    .venv/bin/python experiments/comm_study.py --study dgc --hosts lbl-h1:1,lbl-h2:1 --seeds 0
    .venv/bin/python experiments/comm_study.py --smoke     # one seed, 2 epochs, 3 modes

``--hosts`` runs the workers there (the namespace cluster, whose link
``python -m toolkit cluster shape`` limits): the seconds to the target are then the wall time a
user waits on that link. Resumable: rows go to ``experiments/comm_study/<study>_<task>.csv``
(``runs.csv`` for the quickstart's distopt study) as runs finish, and a cell already there is not
run again (``--fresh`` starts over). The tables are what ``docs/notes/study.md`` quotes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

RESULTS = ROOT / "experiments" / "comm_study"
TASKS = {"quickstart": ("quickstart.yaml", 20), "resnet20": ("resnet20_digits.yaml", 10)}
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


def topk(ratio: float, *options: str) -> list[str]:
    return ["allreduce.compression=topk", f"allreduce.ratio={ratio}"] + [
        f"allreduce.{option}" for option in options
    ]


DGC_MODES = {
    "dense": [],
    "topk 1%": topk(0.01),
    "topk 1%, DGC": topk(0.01, "dgc=true"),
    "topk 1%, fp16 values": topk(0.01, "value_dtype=float16"),
    "topk 0.1%": topk(0.001),
    "topk 0.1%, DGC": topk(0.001, "dgc=true"),
    "topk 0.1%, DGC less momentum correction": topk(
        0.001, "dgc=true", "momentum_correction=false", "momentum_masking=false"
    ),
    "topk 0.1%, DGC less masking": topk(0.001, "dgc=true", "momentum_masking=false"),
    "topk 0.1%, DGC less local clipping": topk(0.001, "dgc=true", "local_clipnorm=0"),
    "topk 0.1%, DGC less warm-up": topk(0.001, "dgc=true", "sparsity_warmup_epochs=0"),
    "topk 0.1%, DGC less dense 1-D": topk(0.001, "dgc=true", "dense_1d=false"),
    "topk 0.1%, DGC less warm-up and dense 1-D": topk(
        0.001, "dgc=true", "sparsity_warmup_epochs=0", "dense_1d=false"
    ),
    # is momentum correction's cost its weaker weight decay (outside the velocity: at momentum
    # 0.9, a tenth of dense SGD's effective decay)? The same runs with and without the
    # correction, and with it at 10x the decay (ResNet-20's SGD: 5e-4 -> 5e-3)
    "topk 0.1%, DGC less warm-up and momentum correction": topk(
        0.001,
        "dgc=true",
        "sparsity_warmup_epochs=0",
        "momentum_correction=false",
        "momentum_masking=false",
    ),
    "topk 0.1%, DGC less warm-up, 10x weight decay": [
        *topk(0.001, "dgc=true", "sparsity_warmup_epochs=0"),
        "optimizer.params.weight_decay=0.005",
    ],
    "2bit ±0.001": ["allreduce.compression=2bit", "allreduce.threshold=0.001"],
    "2bit ±0.01": ["allreduce.compression=2bit", "allreduce.threshold=0.01"],
    # ResNet-20 at the quickstart's count: 54 entries an update of 0.27M (is it the count?)
    "topk 0.02%": topk(0.0002),
    "topk 0.02%, DGC": topk(0.0002, "dgc=true"),
}
PER_LAYER = "fusion_threshold_mb=0.000001"  # every tensor a bucket: top-k takes 1% of each
LARS_MODES = {  # the trust ratio from the dense norm (LARS tasks only; DGC's rows have it)
    "topk 1%, dense norm": topk(0.01, "dense_norm=true"),
    "topk 0.1%, dense norm": topk(0.001, "dense_norm=true"),
    "2bit ±0.001, dense norm": [*DGC_MODES["2bit ±0.001"], "allreduce.dense_norm=true"],
}
LARS = [  # the quickstart's LARS, for ResNet-20
    "optimizer.name=lars",
    "optimizer.learning_rate=0.5",
    "optimizer.params={momentum: 0.9, weight_decay: 0.0005, trust_coefficient: 0.02}",
]
EVERY_ENTRY = topk(1.0)  # every entry sent through the encoded path: dense, with DGC's switches
STEADY_MODES = {  # which of DGC's techniques steadies the quickstart's LARS over 60 epochs?
    "dense": [],
    "topk 1%, DGC": DGC_MODES["topk 1%, DGC"],
    "topk 1%, DGC less local clipping": topk(0.01, "dgc=true", "local_clipnorm=0"),
    "dense, local clipping 5": [*EVERY_ENTRY, "allreduce.local_clipnorm=5"],
    "dense, momentum correction": [*EVERY_ENTRY, "allreduce.momentum_correction=true"],
    "dense, 5-epoch rate warm-up": ["schedule.warmup.epochs=5"],
    "dense, rate x0.5": ["optimizer.learning_rate=0.25"],
    # none of the above alone held: which of DGC's parts does its holding need?
    "topk 1%, DGC less momentum correction": topk(
        0.01, "dgc=true", "momentum_correction=false", "momentum_masking=false"
    ),
    "topk 1%, DGC less warm-up": topk(0.01, "dgc=true", "sparsity_warmup_epochs=0"),
    "topk 1%, DGC less dense 1-D": topk(0.01, "dgc=true", "dense_1d=false"),
}
STEADY_EPOCHS = {"steady": 60}  # where the quickstart's dense LARS falls and DGC holds
CROSS_MODES = ("dense", "topk 1%", "topk 1%, DGC")
CROSS = {  # each task with the other's optimizer: is the gap LARS's or the small model's?
    "quickstart": {
        **{mode: [*SGD, *DGC_MODES[mode]] for mode in CROSS_MODES},
        # does the fused bucket starve its small layers? top-k per layer instead
        "topk 1%, per layer": [*SGD, *topk(0.01, PER_LAYER)],
        "topk 1%, DGC, per layer": [*SGD, *topk(0.01, "dgc=true", PER_LAYER)],
    },
    "resnet20": {mode: [*LARS, *DGC_MODES[mode]] for mode in CROSS_MODES},
}


def run_cell(
    task: str, mode: str, overrides: list[str], seed: int, epochs: int, root: str, hosts
) -> dict:
    from toolkit import config as config_lib
    from toolkit.launching import launch
    from toolkit.plan import Scale
    from toolkit.runs import monitor
    from toolkit.runs.curves import bytes_axis
    from toolkit.runs.events import read_events

    overrides = [*overrides, f"seed={seed}", f"epochs={epochs}", "checkpoint.every_epochs=100"]
    config = config_lib.load(ROOT / "experiments" / TASKS[task][0], overrides)
    run = launch.launch(config, runs_root_dir=root, hosts=hosts)
    state = monitor.follow(run, progress=False)["state"]
    events = read_events(run.events_path)
    evals = events[events["phase"] == "eval"]
    per_update = Scale.of(config).steps_per_update
    sent = bytes_axis(events, per_update)
    start = events["wall"].min()
    curve = [  # (updates, seconds since the first event, accuracy) per epoch
        (step / per_update, wall - start, accuracy)
        for step, wall, accuracy in evals[["step", "wall", "accuracy"]].itertuples(index=False)
    ]
    return {
        "task": task,
        "mode": mode,
        "seed": seed,
        "epochs": epochs,
        "hosts": hosts or "localhost",
        "state": state,
        "final_accuracy": float(evals["accuracy"].iloc[-1]) if len(evals) else float("nan"),
        "bytes_sent": float(sent.max()) if sent is not None else 0.0,
        "curve": json.dumps(curve),
        "run_id": run.run_id,
    }


def to_target(curve: str, target: float) -> tuple[float, float]:
    """The updates and seconds at the first epoch whose test accuracy reached ``target``."""
    for updates, seconds, accuracy in json.loads(curve):
        if accuracy >= target:
            return updates, seconds
    return math.nan, math.nan


def table(rows: pd.DataFrame) -> str:
    """Mean ± std per mode over its completed runs (a failed one is counted, ``2 of 3``, but
    its truncated accuracy and bytes are not averaged in), against dense; updates and seconds to
    dense's accuracy less a point (the median over the seeds that reached it)."""
    attempted = rows.groupby("mode", sort=False)["seed"].count()
    rows = rows[rows["state"] == "completed"]
    dense_rows = rows[rows["mode"] == "dense"]
    target = dense_rows["final_accuracy"].mean() - 0.01
    if "curve" in rows:
        reached = rows["curve"].fillna("[]").map(lambda curve: to_target(curve, target))
        rows = rows.assign(updates=[u for u, _ in reached], seconds=[s for _, s in reached])
    grouped = rows.groupby("mode", sort=False)
    summary = grouped.agg(
        runs=("seed", "count"),
        accuracy=("final_accuracy", "mean"),
        spread=("final_accuracy", "std"),
        bytes_sent=("bytes_sent", "mean"),
    )
    if "updates" in rows:
        summary = summary.join(
            grouped.agg(
                reached=("updates", "count"),
                updates=("updates", "median"),
                seconds=("seconds", "median"),
            )
        )
    dense = summary.loc["dense"] if "dense" in summary.index else None
    timed = "updates" in summary
    header = (
        "| mode | runs | final test accuracy (mean ± std) | vs dense (points) | MB sent per worker "
        "| x fewer bytes than dense |"
    )
    lines = [
        header + (f" updates to {100 * target:.1f}% (median) | seconds to it |" if timed else ""),
        "| --- | --- | --- | --- | --- | --- |" + (" --- | --- |" if timed else ""),
    ]
    for mode, row in summary.iterrows():
        versus = "" if dense is None else f"{100 * (row.accuracy - dense.accuracy):+.1f}"
        fewer = (
            f"{dense.bytes_sent / row.bytes_sent:,.0f}"
            if dense is not None and row.bytes_sent > 0
            else "-"
        )
        spread = "-" if pd.isna(row.spread) else f"{100 * row.spread:.1f}"
        runs = f"{int(row.runs)}" + (f" of {attempted[mode]}" if attempted[mode] > row.runs else "")
        line = (
            f"| {mode} | {runs} | {100 * row.accuracy:.1f}% ± {spread} "
            f"| {versus} | {row.bytes_sent / 1e6:,.2f} | {fewer} |"
        )
        if timed:
            late = "" if row.reached == row.runs else f" ({int(row.reached)} of {int(row.runs)})"
            line += (
                " - | - |"
                if row.reached == 0
                else f" {row.updates:,.0f}{late} | {row.seconds:,.0f} |"
            )
        lines.append(line)
    return "\n".join(lines)


def trust_ratios(root: Path) -> pd.DataFrame:
    """Per kept LARS run under ``root``: its mode, seed and the median trust ratio of each
    variable over the first quarter and the last half of its ``trust_ratio`` events."""
    from toolkit.runs.events import read_events
    from toolkit.runs.rundir import list_runs

    rows = []
    for run in list_runs(root):
        config = run.config()
        events = read_events(run.events_path)
        ratios = events[events["phase"] == "trust_ratio"].dropna(axis=1, how="all")
        mode = "dense" if config.allreduce.compression == "none" else "topk 1%, DGC"
        n = len(ratios)
        for stretch, part in (
            ("first quarter", ratios.iloc[: n // 4]),
            ("last half", ratios.iloc[n // 2 :]),
        ):
            for column in [c for c in part if c.startswith("trust_ratio/")]:
                rows.append(
                    {
                        "mode": mode,
                        "seed": config.seed,
                        "stretch": stretch,
                        "variable": column.removeprefix("trust_ratio/"),
                        "median_trust_ratio": float(part[column].median()),
                    }
                )
    return pd.DataFrame(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", choices=("distopt", "dgc", "cross", "steady"), default="distopt")
    parser.add_argument("--runs", type=Path, help="keep the run directories here (default: not)")
    parser.add_argument("--task", choices=sorted(TASKS), default="quickstart")
    parser.add_argument("--hosts", help="host:slots,... for the workers (default: localhost)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated")
    parser.add_argument("--modes", help="names separated by ; (default: the study's all)")
    parser.add_argument("--epochs", type=int, help="default: the task's (20 or 10)")
    parser.add_argument("--smoke", action="store_true", help="one seed, 2 epochs, 3 modes")
    parser.add_argument("--fresh", action="store_true", help="forget earlier rows")
    parser.add_argument("--results", type=Path, help="the CSV (default: by study and task)")
    parser.add_argument(
        "--trust-ratios", action="store_true", help="only: the kept LARS runs' trust ratios"
    )
    args = parser.parse_args()
    if args.trust_ratios:
        ratios = trust_ratios(args.runs)
        ratios.to_csv(RESULTS / f"trust_ratios_{args.task}.csv", index=False)
        wide = ratios.pivot_table(
            index=["stretch", "variable"], columns="mode", values="median_trust_ratio"
        )
        print(wide.assign(ratio=wide["topk 1%, DGC"] / wide["dense"]).round(3).to_string())
        return 0
    if args.study == "steady" and args.task != "quickstart":
        parser.error("--study steady: the quickstart's LARS only")
    catalogue = {
        "distopt": MODES,
        "dgc": DGC_MODES,
        "cross": CROSS[args.task],
        "steady": STEADY_MODES,
    }[args.study]
    if args.study == "dgc" and args.task == "quickstart":  # LARS
        catalogue = {**catalogue, **LARS_MODES}
    modes = args.modes.split(";") if args.modes else list(catalogue)
    if args.smoke:
        modes = [m for m in catalogue if m in ("dense", "topk 1%", "local SGD H=4", "2bit ±0.01")]
    if unknown := sorted(set(modes) - set(catalogue)):
        parser.error(f"--modes: unknown {unknown}; choose from {list(catalogue)}")
    seeds = (0,) if args.smoke else tuple(int(s) for s in args.seeds.split(","))
    epochs = 2 if args.smoke else args.epochs or STEADY_EPOCHS.get(args.study, TASKS[args.task][1])
    name = "runs" if (args.study, args.task) == ("distopt", "quickstart") else args.study
    results = args.results or RESULTS / f"{name}{'' if name == 'runs' else '_' + args.task}.csv"
    where = args.hosts or "localhost"
    done = pd.DataFrame()
    if results.exists() and not args.fresh:
        done = pd.read_csv(results)
        for column, value in (("task", "quickstart"), ("hosts", "localhost")):
            done[column] = done[column].fillna(value) if column in done else value
    results.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        root = str(args.runs or scratch)
        for seed in seeds:  # seeds outermost: an early stop leaves every mode with some runs
            for mode in modes:
                cell = (
                    (done.get("mode") == mode)
                    & (done.get("seed") == seed)
                    & (done.get("epochs") == epochs)
                    & (done.get("hosts") == where)
                )
                if len(done) and cell.any():
                    continue
                row = run_cell(args.task, mode, catalogue[mode], seed, epochs, root, args.hosts)
                print(
                    f"{mode}, seed {seed}: {row['state']}, accuracy {row['final_accuracy']:.3f}, "
                    f"{row['bytes_sent'] / 1e6:,.2f} MB sent",
                    flush=True,
                )
                done = pd.concat([done, pd.DataFrame([row])], ignore_index=True)
                done.to_csv(results, index=False)
    rows = done[(done["epochs"] == epochs) & done["mode"].isin(modes) & (done["hosts"] == where)]
    print(
        f"\n{args.task}, 2 workers on {where}, {epochs} epochs, seeds {sorted(set(rows['seed']))}"
    )
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
