#!/usr/bin/env python
"""The large-batch study's analysis: tables and figure from the runs of its two sweeps.

The study itself is two sweep files (their comments give the methods; docs/notes/study.md the
reading), run like any sweep, resumable::

    python -m toolkit --runs RUNS sweep experiments/study/study.yaml    # 93 runs
    python -m toolkit --runs RUNS sweep experiments/study/tuning.yaml   # 11 runs
    python experiments/large_batch_study.py --runs RUNS                 # this script

It reads each cell's results through :mod:`toolkit.launching.sweep` and writes ``results.csv``,
``tuning.csv``, ``table.md`` (final test accuracy, mean ± std over seeds, with the counts of
diverged and failed runs) and ``accuracy_vs_batch.html`` to ``--out`` (default
``experiments/study``). Notebook 03 imports it for the labels, the table and the figure.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from toolkit.launching import sweep, sweep_results  # noqa: E402

STUDY_DIR = ROOT / "experiments" / "study"
STUDY, TUNING = STUDY_DIR / "study.yaml", STUDY_DIR / "tuning.yaml"
LABELS = {
    "sgd": "SGD baseline (B=32)",
    "sgd_paper_size": "SGD baseline (B=32), 4k train (paper size)",
    "sgd_noscale": "SGD, rate not scaled (control)",
    "sgd_linear": "SGD + linear scaling",
    "sgd_linear_warmup": "SGD + linear scaling + warmup",
    "lars": "LARS + linear scaling",
    "lars_sqrt": "LARS + sqrt scaling",
    "lbsgd_linear": "LBSGD linear",
    "lbsgd_power2": "LBSGD power2",
    "lbsgd_sqrt": "LBSGD sqrt",
    "lbsgd_lars": "LBSGD lars",
}
BASELINE = "sgd"
CHANCE = 0.15  # final test accuracy below this counts as a failed run (chance is 10%)
COLUMNS = [
    "method",
    "global_batch",
    "seed",
    *sweep_results.METRICS,
    "state",
    "diverged",
    "reason",
    "run_id",
]


def study_results(study: sweep.Sweep, root: Path | str | None = None) -> pd.DataFrame:
    """One row per cell of ``study`` (a sweep whose axes are method, batch and seed)."""
    return sweep_results.results(study, root)[COLUMNS]


def summarize(results: pd.DataFrame) -> pd.DataFrame:
    """Per method and global batch: :func:`toolkit.launching.sweep_results.aggregate` over
    seeds (final test accuracy over the completed runs), plus ``at_chance``, the runs that
    failed or ended below :data:`CHANCE` (a collapsed network predicts one class: about 10% on
    MNIST-1D's balanced test set), ``updates_max`` (the updates planned: a diverged run recorded
    them too), and the best accuracy and wall time averaged over every run, diverged ones
    included."""
    table = sweep_results.aggregate(
        results, ("final_test_accuracy",), by=["method", "global_batch"]
    )
    low = results.assign(
        low=(results["state"] != "completed") | (results["final_test_accuracy"] < CHANCE)
    )
    groups = low.groupby(["method", "global_batch"], sort=False)
    table["at_chance"] = groups["low"].sum().values
    table["updates_max"] = groups["updates"].max().values
    table["best_test_accuracy_mean"] = groups["best_test_accuracy"].mean().values
    table["wall_s_mean"] = groups["wall_s"].mean().values
    order = {method: i for i, method in enumerate(LABELS)}
    return table.sort_values(
        ["global_batch", "method"], key=lambda c: c.map(order) if c.name == "method" else c
    ).reset_index(drop=True)


def markdown_table(results: pd.DataFrame) -> str:
    """The study table: final test accuracy (%) as mean ± std over seeds."""
    table = summarize(results)

    def pm(mean, std):
        if math.isnan(mean):
            return "—"
        return f"{100 * mean:.1f} ± {100 * std:.1f}" if not math.isnan(std) else f"{100 * mean:.1f}"

    def counts(column):
        return [f"{d}/{n}" for d, n in zip(table[column], table["cells"], strict=True)]

    shown = pd.DataFrame(
        {
            "method": [LABELS.get(m, m) for m in table["method"]],
            "global batch": table["global_batch"],
            "updates": ["—" if math.isnan(v) else f"{v:.0f}" for v in table["updates_max"]],
            "final test acc. % (mean ± std)": [
                pm(m, s)
                for m, s in zip(
                    table["final_test_accuracy_mean"], table["final_test_accuracy_std"], strict=True
                )
            ],
            "best test acc. % (mean)": [
                "—" if math.isnan(v) else f"{100 * v:.1f}" for v in table["best_test_accuracy_mean"]
            ],
            "diverged (NaN)": counts("diverged"),
            "failed (NaN or < 15%)": counts("at_chance"),
            "wall s (mean)": [f"{v:.0f}" for v in table["wall_s_mean"]],
        }
    )
    return shown.to_markdown(index=False)


def figure(results: pd.DataFrame, title: str = "MNIST-1D CNN: final test accuracy vs global batch"):
    """:func:`toolkit.launching.sweep_results.figure` of final test accuracy (%) against the
    global batch, one line per method, with the small-batch baseline as a band instead of a
    point."""
    percent = results.assign(final_test_accuracy=100 * results["final_test_accuracy"])
    base = percent[percent["method"] == BASELINE]
    others = percent[percent["method"] != BASELINE]
    fig = sweep_results.figure(others, "final_test_accuracy", x="global_batch", title=title)
    for trace in fig.data:
        trace.name = LABELS.get(trace.name, trace.name)
    if len(base):
        accuracy = base["final_test_accuracy"].dropna()
        mean, std = accuracy.mean(), accuracy.std(ddof=1) if len(accuracy) > 1 else 0.0
        fig.add_hrect(y0=mean - std, y1=mean + std, line_width=0, fillcolor="grey", opacity=0.2)
        fig.add_hline(
            y=mean,
            line_dash="dash",
            line_color="grey",
            annotation_text=f"{LABELS[BASELINE]}: {mean:.1f}%",
        )
    fig.update_layout(
        xaxis={"tickvals": sorted(percent["global_batch"].unique())},
        yaxis={"title": "final test accuracy (%)"},
        legend={"title": "method"},
    )
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, help="the runs root of the sweeps (default $LBL_RUNS)")
    parser.add_argument("--out", type=Path, default=STUDY_DIR, help="results folder")
    parser.add_argument(
        "--plotlyjs",
        choices=["cdn", "embed"],
        default="cdn",
        help="the HTML plot loads plotly.js from its CDN (small file) or embeds it (offline)",
    )
    args = parser.parse_args(argv)

    results = study_results(sweep.load(STUDY), args.runs)
    tuning = sweep_results.results(sweep.load(TUNING), args.runs)
    pending = (~results["state"].isin(["completed", "failed", "stopped"])).sum()
    if pending:
        print(f"note: {pending} of {len(results)} study runs have not ended: run the sweep first")
    args.out.mkdir(parents=True, exist_ok=True)
    results.to_csv(args.out / "results.csv", index=False)
    tuning.to_csv(args.out / "tuning.csv", index=False)
    shown = tuning[
        ["method", "global_batch", "optimizer.learning_rate", "final_test_accuracy", "wall_s"]
    ]
    print(shown.to_markdown(index=False), "\n")
    table = markdown_table(results)
    print(table)
    (args.out / "table.md").write_text(table + "\n")
    figure(results).write_html(
        args.out / "accuracy_vs_batch.html",
        include_plotlyjs="cdn" if args.plotlyjs == "cdn" else True,
    )
    print(f"wrote results.csv, tuning.csv, table.md and accuracy_vs_batch.html to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
