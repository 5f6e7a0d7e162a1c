#!/usr/bin/env python
"""Large-batch study on MNIST-1D: what happens to test accuracy when the global batch grows at a
fixed number of epochs, and which large-batch recipe holds up best.

Methods (``METHODS``), all with momentum 0.9, coupled weight decay 1e-4 and a cosine decay over
the whole run (the toolkit's ``Warmup`` wraps it where a method warms up):

* ``sgd``: the small-batch baseline, SGD at the base batch (32) with the tuned rate ``sgd_lr``.
* ``sgd_noscale``: a control, SGD at ``sgd_lr`` at every batch (no scaling, no warmup): what
  fewer updates cost when the rate stays where it was stable.
* ``sgd_linear``: SGD, linear scaling rule ``lr = sgd_lr * B / 32``, no warmup.
* ``sgd_linear_warmup``: the same plus Goyal et al.'s gradual warmup, linear from ``sgd_lr``
  (``initial_multiplier = 32 / B``) to ``sgd_lr * B / 32`` over ``warmup_epochs``.
* ``lars``: LARS (trust coefficient 0.02, biases unadapted), ``lr = lars_lr * B / 32``, linear
  warmup from 0 over ``warmup_epochs``. ``lars_sqrt``: the same with square-root scaling,
  ``lr = lars_lr * sqrt(B / 32)`` (the trust ratio already normalises each layer's step, so the
  linear rule is not the only candidate; both rules are fixed in advance, not tuned per batch).
* ``lbsgd_linear|power2|sqrt|lars``: MXNet's LBSGD. Each step sees a device batch of
  ``lbsgd_device_batch`` (128) and accumulates ``batch_scale = B / 128`` of them per update. Its
  base rate is the device batch's rate ``sgd_lr * 128 / 32``; the linear/power2/sqrt strategies
  ramp the multiplier from 1 to ``batch_scale`` over ``warmup_epochs`` (so after warmup the rate
  equals ``sgd_linear``'s), the ``lars`` strategy multiplies the base rate ``lbsgd_lars_lr`` by
  a clipped per-layer ``||w|| / ||g||`` instead, with no batch-size factor (MXNet semantics).

``lars_sqrt`` and ``lbsgd_lars`` also run at the batch their rate was tuned at
(``small_batch_runs``: 32 and 128), so a gain at large batch can be told apart from a better
optimiser at small batch.

Runs go one at a time, in-process through ``toolkit.train.train`` (default: one worker, which
uses both CPU cores and avoids horovodrun's start-up and allreduce overhead; the global batch
and hence the optimisation are the same), or with ``--np N`` through ``toolkit.launch`` under
``horovodrun`` (``per_worker = B / N``). Results are appended to ``--out/results.csv`` as each run
ends, so an interrupted study resumes where it stopped (``--fresh`` starts over).

    python experiments/large_batch_study.py                 # the full study
    python experiments/large_batch_study.py --tune          # the small-batch learning-rate sweep
    python experiments/large_batch_study.py --smoke         # a tiny version (seconds)
    python experiments/large_batch_study.py --np 2          # through horovodrun, 2 workers

Notebooks import this file (``notebooks/03_large_batch_study.ipynb``).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from toolkit import monitor  # noqa: E402
from toolkit.config import ExperimentConfig, from_mapping  # noqa: E402
from toolkit.events import read_events  # noqa: E402
from toolkit.rundir import RunDir  # noqa: E402

STUDY_DIR = ROOT / "experiments" / "study"
METHODS = (
    "sgd",
    "sgd_noscale",
    "sgd_linear",
    "sgd_linear_warmup",
    "lars",
    "lars_sqrt",
    "lbsgd_linear",
    "lbsgd_power2",
    "lbsgd_sqrt",
    "lbsgd_lars",
)
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
# Greydanus (2020), MNIST-1D test accuracy, 4,000 training examples.
PUBLISHED = {"cnn": 0.94, "mlp": 0.68, "logreg": 0.32}
CHANCE = 0.15  # final test accuracy below this counts as a failed run (chance is 10%)
KEY = ("method", "global_batch", "seed", "epochs", "num_samples", "learning_rate", "workers")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything the grid depends on. ``*_lr`` are the rates tuned at the small batch."""

    num_samples: int = 20000  # MNIST-1D examples, 80% train: 16,000 train / 4,000 test
    epochs: int = 15
    warmup_epochs: int = 3
    base_batch: int = 32
    batches: tuple[int, ...] = (256, 1024, 4096)
    seeds: tuple[int, ...] = (0, 1, 2)
    methods: tuple[str, ...] = METHODS
    paper_size_baseline: bool = True  # also the baseline on 5,000 examples (the paper's size)
    # (method, batch): also run at the batch its rate was tuned at (TUNE_GRID), to tell a
    # better optimizer from better scaling
    small_batch_runs: tuple[tuple[str, int], ...] = (("lars_sqrt", 32), ("lbsgd_lars", 128))
    sgd_lr: float = 0.1  # tuning.csv: 0.03 / 0.1 / 0.3 -> 92.6 / 94.1 / 9.7 % after 5 epochs
    lars_lr: float = 0.3  # 0.1 / 0.3 / 1 / 3 -> 82.8 / 93.7 / 9.3 / 10.9 %
    lbsgd_lars_lr: float = 0.03  # at B=128: 0.003 / 0.01 / 0.03 / 0.1 -> 63.1 / 89.8 / 91.9 / 9.7 %
    lbsgd_device_batch: int = 128
    momentum: float = 0.9
    weight_decay: float = 1e-4
    trust_coefficient: float = 0.02
    schedule: str = "cosine"


SMOKE = Settings(
    num_samples=5000,
    epochs=2,
    warmup_epochs=1,
    batches=(256,),
    seeds=(0,),
    methods=("sgd", "sgd_linear_warmup", "lars", "lbsgd_sqrt"),
    paper_size_baseline=False,
)

# Small-batch learning-rate sweeps (seed 0, ``TUNE_EPOCHS`` epochs): method -> (batch, rates).
TUNE_EPOCHS = 5
TUNE_GRID = {
    "sgd": (32, (0.03, 0.1, 0.3)),
    "lars": (32, (0.1, 0.3, 1.0, 3.0)),
    "lbsgd_lars": (128, (0.003, 0.01, 0.03, 0.1)),
}


# --------------------------------------------------------------------------------------- grid


def method_config(
    method: str,
    global_batch: int,
    seed: int,
    settings: Settings = Settings(),
    world_size: int = 1,
    *,
    learning_rate: float | None = None,
    num_samples: int | None = None,
) -> ExperimentConfig:
    """The validated config of one cell of the grid (``learning_rate`` overrides the tuned
    base rate, for sweeps). ``world_size`` workers share the global batch."""
    s = settings
    num_samples = num_samples or s.num_samples
    base = s.base_batch
    warmup = {"epochs": 0}
    scaling = {"rule": "none"}
    params = {"momentum": s.momentum, "weight_decay": s.weight_decay}
    per_call = global_batch  # examples per optimizer call, over all workers
    if method in ("sgd", "sgd_paper_size", "sgd_noscale", "sgd_linear", "sgd_linear_warmup"):
        optimizer, lr = "sgd", s.sgd_lr
        if method in ("sgd", "sgd_paper_size") and global_batch != base:
            raise ValueError(f"{method} is the baseline at the base batch {base}")
        if method in ("sgd_linear", "sgd_linear_warmup"):
            scaling = {"rule": "linear", "base_batch": base}
        if method == "sgd_linear_warmup":
            warmup = {
                "epochs": s.warmup_epochs,
                "strategy": "linear",
                "initial_multiplier": min(1.0, base / global_batch),
            }
    elif method in ("lars", "lars_sqrt"):
        optimizer, lr = "lars", s.lars_lr
        params["trust_coefficient"] = s.trust_coefficient
        if method == "lars":
            scaling = {"rule": "linear", "base_batch": base}
        else:  # the config has no sqrt rule: scale the base rate here
            lr = s.lars_lr * math.sqrt(global_batch / base)
        warmup = {"epochs": s.warmup_epochs, "strategy": "linear"}
    elif method.startswith("lbsgd_"):
        optimizer = "lbsgd"
        strategy = method.removeprefix("lbsgd_")
        device = min(s.lbsgd_device_batch, global_batch)
        if global_batch % device:
            raise ValueError(f"global batch {global_batch} is not a multiple of {device}")
        per_call = device
        lr = s.lbsgd_lars_lr if strategy == "lars" else s.sgd_lr * device / base
        params.update(
            warmup_strategy=strategy,
            warmup_epochs=s.warmup_epochs,
            batch_scale=global_batch // device,
        )
    else:
        raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
    if per_call % world_size:
        raise ValueError(f"{per_call} examples per step do not split over {world_size} workers")
    per_worker = per_call // world_size
    num_train = int(num_samples * 0.8)
    steps = max(1, num_train // per_call)
    config = from_mapping(
        {
            "name": f"{method}-b{global_batch}-s{seed}",
            "seed": seed,
            "dataset": {"name": "mnist1d", "params": {"num_samples": num_samples}},
            "model": {"name": "cnn1d"},
            "optimizer": {
                "name": optimizer,
                "learning_rate": learning_rate or lr,
                "params": params,
            },
            "schedule": {"name": s.schedule, "warmup": warmup},
            "batch": {"per_worker": per_worker},
            "lr_scaling": scaling,
            "epochs": s.epochs,
            "workers": world_size,
            "logging": {"every_steps": max(1, steps // 4), "trust_ratio_every_steps": 10**9},
            "checkpoint": {"every_epochs": s.epochs},
        }
    )
    assert config.global_batch() == global_batch, (config.global_batch(), global_batch)
    return config


@dataclasses.dataclass(frozen=True)
class Cell:
    method: str
    global_batch: int
    seed: int
    config: ExperimentConfig

    @property
    def key(self) -> tuple:
        c = self.config
        return (
            self.method,
            self.global_batch,
            self.seed,
            c.epochs,
            c.dataset.params["num_samples"],
            round(c.optimizer.learning_rate, 10),
            c.workers,
        )


def grid(settings: Settings = Settings(), world_size: int = 1) -> list[Cell]:
    """Every run of the study: the baselines at the base batch, then each method at each batch."""
    s = settings
    cells = []
    for seed in s.seeds:
        if "sgd" in s.methods:
            cells.append(
                Cell(
                    "sgd",
                    s.base_batch,
                    seed,
                    method_config("sgd", s.base_batch, seed, s, world_size),
                )
            )
        if s.paper_size_baseline:
            config = method_config(
                "sgd_paper_size", s.base_batch, seed, s, world_size, num_samples=5000
            )
            cells.append(Cell("sgd_paper_size", s.base_batch, seed, config))
        for method, batch in s.small_batch_runs:
            if method in s.methods:
                config = method_config(method, batch, seed, s, world_size)
                cells.append(Cell(method, batch, seed, config))
    for method in s.methods:
        if method == "sgd":
            continue
        for batch in s.batches:
            for seed in s.seeds:
                cells.append(
                    Cell(method, batch, seed, method_config(method, batch, seed, s, world_size))
                )
    return cells


def tune_grid(settings: Settings = Settings()) -> list[Cell]:
    """The small-batch learning-rate sweep (seed 0, ``TUNE_EPOCHS`` epochs, 1 epoch of warmup)."""
    s = dataclasses.replace(settings, epochs=TUNE_EPOCHS, warmup_epochs=1)
    cells = []
    for method, (batch, rates) in TUNE_GRID.items():
        for lr in rates:
            config = method_config(method, batch, 0, s, learning_rate=lr)
            cells.append(Cell(method, batch, 0, config))
    return cells


# ------------------------------------------------------------------------------------ running


def result_row(run: RunDir, cell: Cell) -> dict:
    """One results.csv row, read back from the run directory."""
    status, config = run.status(), cell.config
    events = read_events(run.events_path)
    evals = events[events["phase"] == "eval"] if "phase" in events else pd.DataFrame()
    completed = status.get("state") == "completed"
    accuracy = evals["accuracy"].dropna() if "accuracy" in evals else pd.Series(dtype=float)
    started, finished = status.get("started"), status.get("finished")
    calls = run.meta().get("total_steps", 0)  # batches per worker, recorded by training
    scale = int(config.optimizer.params.get("batch_scale", 1))
    return {
        "method": cell.method,
        "global_batch": cell.global_batch,
        "seed": cell.seed,
        "final_test_accuracy": float(accuracy.iloc[-1])
        if completed and len(accuracy)
        else math.nan,
        "best_test_accuracy": float(accuracy.max()) if len(accuracy) else math.nan,
        "final_train_loss": float(evals["train_loss"].iloc[-1])
        if completed and "train_loss" in evals
        else math.nan,
        "wall_s": round(finished - started, 2) if started and finished else math.nan,
        "state": status.get("state"),
        "reason": (status.get("reason") or "")[:200],
        "epochs": config.epochs,
        "num_samples": config.dataset.params["num_samples"],
        "updates": calls // scale,
        "learning_rate": round(config.optimizer.learning_rate, 10),
        "peak_lr": config.scaled_learning_rate()
        * (
            scale
            if config.optimizer.name == "lbsgd"
            and config.optimizer.params.get("warmup_strategy") != "lars"
            else 1
        ),
        "workers": config.workers,
        "per_worker": config.batch.per_worker,
        "run_id": run.run_id,
    }


def cell_of(run: RunDir) -> Cell | None:
    """The grid cell a run directory holds, from its config's name ``<method>-b<B>-s<seed>``
    (``None`` for runs that are not part of a study)."""
    try:
        config = run.config()
    except Exception:  # a half-written run directory
        return None
    match = re.fullmatch(r"(?P<method>[a-z0-9_]+)-b(?P<batch>\d+)-s(?P<seed>\d+)", config.name)
    if not match or match["method"] not in (*METHODS, "sgd_paper_size"):
        return None
    return Cell(match["method"], int(match["batch"]), int(match["seed"]), config)


def rows_from_runs(runs: Iterable[RunDir]) -> pd.DataFrame:
    """results.csv rows read back from run directories (those of the study only)."""
    rows = []
    for run in runs:
        cell = cell_of(run)
        if cell is not None:
            rows.append(result_row(run, cell))
    return pd.DataFrame(rows)


def run_in_process(cell: Cell, runs_root: Path) -> RunDir:
    """Train ``cell`` in this process (one worker); a diverged run is returned as failed."""
    import keras

    from toolkit.callbacks import NonFiniteLoss
    from toolkit.rundir import new_run_id
    from toolkit.train import train

    keras.backend.clear_session()
    gc.collect()
    run_dir = Path(runs_root) / new_run_id(cell.config.name)
    try:
        return train(cell.config, run_dir, verbose=0)
    except NonFiniteLoss:  # recorded as failed in status.json, with the reason
        return RunDir(run_dir)


def run_launched(
    cell: Cell, runs_root: Path, np_workers: int, progress: bool = True, timeout_s: float = 3600
) -> RunDir:
    """Start ``cell`` with ``toolkit.launch`` (horovodrun, ``np_workers`` Gloo workers), watch it
    to the end and return its run directory."""
    from toolkit import launch as launcher

    run = launcher.launch(cell.config, np=np_workers, runs_root_dir=runs_root)
    monitor.follow(run, progress=progress, timeout_s=timeout_s)
    return run


def run_study(
    cells: Iterable[Cell],
    results_path: Path | None,
    runs_root: Path,
    *,
    np_workers: int | None = None,
    fresh: bool = False,
    log: Callable[[str], None] = print,
    progress: bool = False,
) -> pd.DataFrame:
    """Run the cells one at a time (skipping those already in ``results_path`` unless
    ``fresh``), appending each row to ``results_path`` as it ends; returns all rows."""
    cells = list(cells)
    done = pd.DataFrame()
    if results_path is not None and results_path.exists() and not fresh:
        done = pd.read_csv(results_path)
    elif results_path is not None and results_path.exists():
        results_path.unlink()
    finished = (
        {tuple(_plain(v) for v in k) for k in done[list(KEY)].itertuples(index=False)}
        if len(done)
        else set()
    )
    rows = []
    for i, cell in enumerate(cells, 1):
        if tuple(_plain(v) for v in cell.key) in finished:
            continue
        start = time.time()
        if np_workers:
            run = run_launched(cell, runs_root, np_workers, progress=progress)
        else:
            run = run_in_process(cell, runs_root)
        row = result_row(run, cell)
        rows.append(row)
        log(
            f"[{i}/{len(cells)}] {cell.method:18s} B={cell.global_batch:<5d} seed={cell.seed} "
            f"{row['state']:9s} test acc {row['final_test_accuracy']:.4f} "
            f"(best {row['best_test_accuracy']:.4f}) {time.time() - start:.0f} s"
        )
        if results_path is not None:
            results_path.parent.mkdir(parents=True, exist_ok=True)
            pd.DataFrame([row]).to_csv(
                results_path, mode="a", header=not results_path.exists(), index=False
            )
    return (
        pd.concat([done, pd.DataFrame(rows)], ignore_index=True)
        if len(done)
        else pd.DataFrame(rows)
    )


def _plain(value):
    if isinstance(value, (float, np.floating)):
        return round(float(value), 10)
    if isinstance(value, (np.integer,)):
        return int(value)
    return value


# ---------------------------------------------------------------------------------- reporting


def summarize(results: pd.DataFrame) -> pd.DataFrame:
    """Mean and standard deviation over seeds, per method and global batch (diverged runs are
    counted, not averaged)."""
    rows = []
    for (method, batch), group in results.groupby(["method", "global_batch"], sort=False):
        ok = group[group["state"] == "completed"]
        rows.append(
            {
                "method": method,
                "global_batch": int(batch),
                "seeds": len(group),
                "diverged": int((group["state"] != "completed").sum()),
                # a collapsed network predicts one class: ~10% on MNIST-1D's balanced test set
                "at_chance": int(
                    (
                        (group["state"] != "completed") | (group["final_test_accuracy"] < CHANCE)
                    ).sum()
                ),
                "final_mean": ok["final_test_accuracy"].mean(),
                "final_std": ok["final_test_accuracy"].std(ddof=1) if len(ok) > 1 else math.nan,
                "best_mean": group["best_test_accuracy"].mean(),
                "updates": int(group["updates"].iloc[0]),
                "wall_s_mean": group["wall_s"].mean(),
            }
        )
    order = {m: i for i, m in enumerate(dict.fromkeys(("sgd", "sgd_paper_size", *METHODS)))}
    table = pd.DataFrame(rows)
    if len(table):
        table = table.sort_values(
            ["global_batch", "method"], key=lambda c: c.map(order) if c.name == "method" else c
        ).reset_index(drop=True)
    return table


def markdown_table(results: pd.DataFrame) -> str:
    """The study table: final test accuracy (%) as mean ± std over seeds."""
    table = summarize(results)

    def pm(mean, std):
        if math.isnan(mean):
            return "—"
        return f"{100 * mean:.1f} ± {100 * std:.1f}" if not math.isnan(std) else f"{100 * mean:.1f}"

    shown = pd.DataFrame(
        {
            "method": [LABELS.get(m, m) for m in table["method"]],
            "global batch": table["global_batch"],
            "updates": table["updates"],
            "final test acc. % (mean ± std)": [
                pm(m, s) for m, s in zip(table["final_mean"], table["final_std"], strict=True)
            ],
            "best test acc. % (mean)": [
                "—" if math.isnan(v) else f"{100 * v:.1f}" for v in table["best_mean"]
            ],
            "diverged (NaN)": [
                f"{d}/{n}" for d, n in zip(table["diverged"], table["seeds"], strict=True)
            ],
            "failed (NaN or < 15%)": [
                f"{d}/{n}" for d, n in zip(table["at_chance"], table["seeds"], strict=True)
            ],
            "wall s (mean)": [f"{v:.0f}" for v in table["wall_s_mean"]],
        }
    )
    return shown.to_markdown(index=False)


def figure(results: pd.DataFrame, title: str = "MNIST-1D CNN: final test accuracy vs global batch"):
    """Plotly figure: final test accuracy (mean ± std over seeds) against the global batch, one
    line per method, the small-batch baseline as a band."""
    import plotly.graph_objects as go

    table = summarize(results)
    fig = go.Figure()
    base = table[table["method"] == "sgd"]
    if len(base):
        mean, std = float(base["final_mean"].iloc[0]), base["final_std"].iloc[0]
        std = 0.0 if math.isnan(std) else float(std)
        fig.add_hrect(
            y0=100 * (mean - std),
            y1=100 * (mean + std),
            line_width=0,
            fillcolor="grey",
            opacity=0.2,
        )
        fig.add_hline(
            y=100 * mean,
            line_dash="dash",
            line_color="grey",
            annotation_text=f"SGD baseline, B={int(base['global_batch'].iloc[0])}: "
            f"{100 * mean:.1f}%",
        )
    for method in [m for m in METHODS if m != "sgd"]:
        part = table[table["method"] == method].sort_values("global_batch")
        if part.empty:
            continue
        fig.add_trace(
            go.Scatter(
                x=part["global_batch"],
                y=100 * part["final_mean"],
                error_y={"type": "data", "array": 100 * part["final_std"].fillna(0)},
                mode="lines+markers",
                name=LABELS[method],
                line={"dash": "dot"} if method.startswith("lbsgd") else None,
            )
        )
    fig.update_layout(
        title=title,
        xaxis={
            "title": "global batch",
            "type": "log",
            "tickvals": sorted(table["global_batch"].unique()),
        },
        yaxis={"title": "final test accuracy (%)"},
        legend={"title": "method"},
        template="plotly_white",
    )
    return fig


# ---------------------------------------------------------------------------------------- cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke", action="store_true", help="a tiny version (4 runs, seconds each)"
    )
    parser.add_argument("--tune", action="store_true", help="the small-batch learning-rate sweep")
    parser.add_argument(
        "--np", type=int, default=None, help="run through toolkit.launch with N workers"
    )
    parser.add_argument("--seeds", type=int, nargs="+", help="seeds (default 0 1 2)")
    parser.add_argument("--epochs", type=int, help="epochs per run (default 15)")
    parser.add_argument(
        "--out", type=Path, help="results folder (default experiments/study, smoke: a temp dir)"
    )
    parser.add_argument(
        "--runs-root", type=Path, help="where run directories go (default: a temp dir)"
    )
    parser.add_argument(
        "--fresh", action="store_true", help="ignore existing results and start over"
    )
    parser.add_argument(
        "--plotlyjs",
        choices=["cdn", "embed"],
        default="cdn",
        help="the HTML plot loads plotly.js from its CDN (small file) or embeds it (offline)",
    )
    args = parser.parse_args(argv)

    settings = SMOKE if args.smoke else Settings()
    if args.seeds:
        settings = dataclasses.replace(settings, seeds=tuple(args.seeds))
    if args.epochs:
        settings = dataclasses.replace(settings, epochs=args.epochs)
    out = args.out or (
        Path(tempfile.mkdtemp(prefix="lbl-study-smoke-")) if args.smoke else STUDY_DIR
    )
    runs_root = args.runs_root or Path(tempfile.mkdtemp(prefix="lbl-study-runs-"))
    print(f"settings: {settings}\nresults: {out}\nrun directories: {runs_root}", flush=True)

    started = time.time()
    if args.tune:
        cells = tune_grid(settings)
        results = run_study(
            cells, out / "tuning.csv", runs_root, np_workers=args.np, fresh=args.fresh
        )
        shown = results.assign(
            final_test_accuracy=(100 * results["final_test_accuracy"]).round(2),
            best_test_accuracy=(100 * results["best_test_accuracy"]).round(2),
        )[
            [
                "method",
                "global_batch",
                "learning_rate",
                "epochs",
                "final_test_accuracy",
                "best_test_accuracy",
                "wall_s",
            ]
        ]
        print(shown.sort_values(["method", "learning_rate"]).to_markdown(index=False))
        return 0

    cells = grid(settings, world_size=args.np or 1)
    print(f"{len(cells)} runs", flush=True)
    results = run_study(
        cells,
        out / "results.csv",
        runs_root,
        np_workers=args.np,
        fresh=args.fresh,
        log=lambda line: print(line, flush=True),
    )
    keys = {tuple(_plain(v) for v in c.key) for c in cells}
    results = results[
        [tuple(_plain(v) for v in k) in keys for k in results[list(KEY)].itertuples(index=False)]
    ]
    table = markdown_table(results)
    print(table)
    (out / "table.md").write_text(table + "\n")
    figure(results).write_html(
        out / "accuracy_vs_batch.html", include_plotlyjs="cdn" if args.plotlyjs == "cdn" else True
    )
    print(
        f"wrote {out / 'results.csv'}, {out / 'table.md'}, {out / 'accuracy_vs_batch.html'} "
        f"({time.time() - started:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
