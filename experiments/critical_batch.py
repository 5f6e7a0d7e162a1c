#!/usr/bin/env python
"""Does the measured gradient noise scale predict the critical batch on MNIST-1D?

McCandlish et al. 2018: the steps ``S`` and examples ``E = B·S`` needed to reach a given loss
trade off as ``(S/S_min − 1)(E/E_min − 1) = 1``, i.e. ``S(B) = S_min·(1 + B_crit/B)`` with
``B_crit = E_min/S_min``, and ``B_crit`` is close to the simple noise scale ``B_simple`` measured
at that loss. This script measures both on the study's model and data:

* **The batch grid.** Plain SGD (momentum 0.9, constant rate) on MNIST-1D (20,000 examples, the
  study's 1-D CNN) at batches 16 … 1024, each with the rates in ``RATES``, seeds 0 and 1. A run
  stops when the loss on 2,000 held-out examples (evaluated every ``~512/B`` steps) reaches
  the lowest of ``--targets`` (or gives up: after 40 epochs, on a non-finite loss, or at
  chance after 5), and records the steps at which it reached each. At each target, ``S(B)``
  is the best rate's mean steps over the seeds; ``S_min`` and ``B_crit`` come from a
  least-squares fit of ``S = S_min + S_min·B_crit / B`` (linear in ``1/B``), with a band from
  refits on seeds drawn per batch (:func:`toolkit.scaling.critical_batch.fit`, which
  ``python -m toolkit calibrate`` runs on any config).
* **The noise scale.** In the same runs, while the held-out loss is within ``[target, 1.5 ×
  target)``, ``B_simple`` is measured every 5 steps from two halves of a fresh batch of 128
  examples (``toolkit.training.callbacks.HalfBatchNorms``, the one-worker method of
  ``toolkit.train``). The pooled ratio of the mean ``tr Σ`` to the mean ``|G|²`` over every
  best-rate run is the ``B_simple`` at that target, with a bootstrap band over runs.
* **Calibration.** ``B_crit / B_simple`` at every target: if it holds steady, a probe's
  ``B_simple`` times that factor estimates ``B_crit``.

    .venv/bin/python experiments/critical_batch.py            # ~15 minutes on 2 cores
    .venv/bin/python experiments/critical_batch.py --smoke    # seconds
    .venv/bin/python experiments/critical_batch.py --num-samples 80000 --targets 0.5 0.4 0.3 \
        --batches 64 256 1024 4096 --rates 0.1 0.2 0.4 --max-steps 12000 \
        --out experiments/critical_batch_80k                   # study v2's second task, ~15 min
    .venv/bin/python experiments/critical_batch.py --dataset markov --model gru \
        --targets 1.6 1.3 1.0 --rates 0.1 0.2 0.4 0.8 --stuck-updates 1000 \
        --out experiments/critical_batch_gru                  # the fourth task, ~30 min
    .venv/bin/python experiments/critical_batch.py --dataset markov --model gru \
        --targets 1.6 1.3 1.0 --batches 16 32 --rates 0.025 0.05 --max-steps 12000 \
        --out experiments/critical_batch_gru --append       # its grid's edges, ~10 min
    .venv/bin/python experiments/critical_batch.py --dataset markov --model gru \
        --targets 1.6 1.3 1.0 --batches 256 512 1024 --rates 1.6 --stuck-updates 1000 \
        --out experiments/critical_batch_gru --append

Writes ``runs.csv`` under ``--out`` (one row per run) and prints the summary that
``docs/notes/study.md`` quotes; on the first task's data, then ``B_simple`` epoch by epoch
through the study's SGD baseline (rate 0.1 with cosine decay, batch 32), from the run's own
``gns`` events.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from toolkit.scaling.critical_batch import fit  # noqa: E402

BATCHES = (16, 32, 64, 128, 256, 512, 1024)
RATES = (0.025, 0.05, 0.1, 0.2, 0.4)
SEEDS = (0, 1)
NUM_SAMPLES = 20_000  # the first task's: 16,000 train, 4,000 test
HELD_OUT = 2000
PROBE_HALF = 64
MAX_EPOCHS = 40
STUCK_EPOCHS, STUCK_LOSS = 5, 2.2


def run(
    batch: int,
    rate: float,
    seed: int,
    targets,
    max_steps: int,
    dataset,
    model_name: str = "cnn1d",
    stuck_updates: int = 0,
) -> list[dict]:
    """One SGD run until the held-out loss reaches the lowest of ``targets``: for each target,
    the steps taken to reach it (``inf`` if not within ``max_steps``, diverged, or still at
    chance after 5 epochs and ``stuck_updates`` updates) and the
    noise-scale measurements taken while the held-out loss was within ``[target, 1.5 ×
    target)``."""
    import keras
    import tensorflow as tf

    from toolkit import optimizers
    from toolkit.scaling.noise_scale import estimate
    from toolkit.training import models
    from toolkit.training.callbacks import HalfBatchNorms

    keras.utils.set_random_seed(seed)
    model = models.build(
        model_name, input_shape=dataset.input_shape, num_classes=dataset.num_classes, seed=seed
    )
    model.compile(
        optimizer=optimizers.get("sgd", learning_rate=rate, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    x_held, y_held = dataset.x_test[:HELD_OUT], dataset.y_test[:HELD_OUT]
    held_loss = tf.function(
        lambda: model.compute_loss(x=x_held, y=y_held, y_pred=model(x_held, training=False)),
        autograph=False,
    )
    halves = HalfBatchNorms(dataset.x_train, dataset.y_train, PROBE_HALF, seed=seed)
    rng = np.random.default_rng(seed)
    order, position = rng.permutation(len(dataset.x_train)), 0
    every = max(1, 512 // batch)
    most_examples, stuck_examples = (n * len(order) for n in (MAX_EPOCHS, STUCK_EPOCHS))
    loss, started = float("inf"), time.perf_counter()
    reached = dict.fromkeys(targets, float("inf"))
    measured = {t: [] for t in targets}
    for step in range(1, min(max_steps, most_examples // batch) + 1):
        if position + batch > len(order):
            order, position = rng.permutation(len(dataset.x_train)), 0
        rows = order[position : position + batch]
        position += batch
        model.train_on_batch(dataset.x_train[rows], dataset.y_train[rows])
        if step % every == 0 or step < every:
            loss = float(held_loss())
            stuck = step * batch > stuck_examples and step > stuck_updates
            if not np.isfinite(loss) or (stuck and loss > STUCK_LOSS):
                break  # diverged, or still at chance (ln 10 = 2.30) after 5 epochs
            for target in targets:
                if loss <= target and reached[target] == float("inf"):
                    reached[target] = step
            if loss <= min(targets):
                break
        near = [t for t in targets if t <= loss < 1.5 * t and reached[t] == float("inf")]
        if near and step % 5 == 0:
            measurement = estimate(*halves(model), PROBE_HALF, 2 * PROBE_HALF)
            for target in near:
                measured[target].append(measurement)
    seconds = round(time.perf_counter() - started, 2)
    return [_row(batch, rate, seed, t, reached[t], loss, measured[t], seconds) for t in targets]


def _row(batch, rate, seed, target, steps, loss, measured, seconds) -> dict:
    grad_sq, trace = (np.array(v) for v in zip(*measured, strict=True)) if measured else ([], [])
    return {
        "batch": batch,
        "rate": rate,
        "seed": seed,
        "target": target,
        "steps": steps,
        "held_out_loss": loss,
        "measurements": len(measured),
        "grad_sq_sum": float(np.sum(grad_sq)),
        "trace_sigma_sum": float(np.sum(trace)),
        "wall_s": seconds,
    }


def summarize(runs: pd.DataFrame) -> str:
    """The steps-to-target table and the fit at each target, then the calibration table:
    ``B_crit`` against ``B_simple`` at every target."""
    lines, calibration = [], []
    for target, part in runs.groupby("target", sort=False):
        found = fit(part, relative=False)  # the published tables' plain least squares
        lines += [
            f"target held-out loss {target}",
            "| batch | best rate | steps to target (mean over seeds) | examples |",
            "|---" * 4 + "|",
        ]
        for row in found.best.itertuples():
            lines.append(
                f"| {row.batch} | {row.rate} | {row.steps:,.0f} | {row.batch * row.steps:,.0f} |"
            )
        lines += ["", f"fit: S_min = {found.s_min:,.0f} steps", ""]
        (cl, ch), (sl, sh) = found.b_crit_band, found.b_simple_band
        relative = fit(part)  # calibrate's estimator: the residuals relative to the steps
        calibration.append(
            f"| {target} | {found.s_min:,.0f} | {found.b_crit:,.0f} ({cl:,.0f}–{ch:,.0f}) "
            f"| {found.b_simple:,.0f} ({sl:,.0f}–{sh:,.0f}; {found.measurements} in "
            f"{found.runs} runs) | {found.ratio:.2f} ({cl / sh:.2f}–{ch / sl:.2f}) "
            f"| {relative.b_crit:,.0f} | {relative.ratio:.2f} |"
        )
    return "\n".join(
        lines
        + [
            "| target loss | S_min | B_crit (10–90%, seeds resampled) | B_simple near it "
            "(10–90%, runs resampled) | B_crit / B_simple (band) | B_crit, relative fit "
            "| its ratio |",
            "|---" * 7 + "|",
            *calibration,
        ]
    )


def noise_through_training(batch: int = 32, rate: float = 0.1, epochs: int = 15) -> str:
    """``B_simple`` through a run of the study's SGD baseline (cosine decay, coupled weight
    decay 1e-4), trained by ``toolkit.train`` with its own noise-scale events (one worker:
    halves of an extra batch of ``batch``)."""
    import tempfile

    from toolkit.config import from_mapping
    from toolkit.runs.events import read_events
    from toolkit.train import train

    config = from_mapping(
        {
            "name": "noise-through-training",
            "dataset": {"name": "mnist1d", "params": {"num_samples": 20000}},
            "optimizer": {
                "name": "sgd",
                "learning_rate": rate,
                "params": {"momentum": 0.9, "weight_decay": 1e-4},
            },
            "schedule": {"name": "cosine"},
            "batch": {"per_worker": batch},
            "epochs": epochs,
            "logging": {"noise_scale_every_steps": 5},
        }
    )
    with tempfile.TemporaryDirectory() as root:
        events = read_events(train(config, runs_root=root, verbose=0).events_path)
    return b_simple_table(b_simple_by_epoch([events]))


def b_simple_by_epoch(runs: list[pd.DataFrame]) -> pd.DataFrame:
    """Per epoch of one or more runs' events: the mean test loss at its end and ``B_simple``,
    the ratio of the mean ``tr Σ`` to the mean ``|G|²`` over every ``gns`` event in it."""
    rows = []
    for epoch in sorted({e for events in runs for e in events[events.phase == "eval"].epoch}):
        evals = pd.concat([e[(e.phase == "eval") & (e.epoch == epoch)] for e in runs])
        gns = pd.concat(
            [e[(e.phase == "gns") & (e.epoch > epoch - 1) & (e.epoch <= epoch)] for e in runs]
        )
        rows.append(
            {
                "epoch": epoch,
                "test_loss": evals.loss.mean(),
                "trace_sigma": gns.trace_sigma_step.mean(),
                "grad_sq": gns.grad_sq_step.mean(),
                "measurements": len(gns),
            }
        )
    return pd.DataFrame(rows)


def b_simple_table(noise: pd.DataFrame) -> str:
    """:func:`b_simple_by_epoch`'s rows as markdown (``n/a`` where the mean ``|G|²`` is not
    positive: halves too small to resolve it)."""
    lines = ["| epoch | test loss | B_simple (ratio of means over the epoch) |", "|---|---|---|"]
    for row in noise.itertuples():
        ratio = (
            f"{row.trace_sigma / row.grad_sq:,.0f}" if row.grad_sq > 0 else "n/a (mean ‖G‖² ≤ 0)"
        )
        lines.append(f"| {row.epoch:.0f} | {row.test_loss:.3f} | {ratio} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--targets", type=float, nargs="+", default=[1.0, 0.8, 0.6], help="held-out losses"
    )
    parser.add_argument("--max-steps", type=int, default=8000)
    parser.add_argument("--dataset", default="mnist1d", help="a dataset of the catalog")
    parser.add_argument("--num-samples", type=int, default=NUM_SAMPLES, help="the dataset's size")
    parser.add_argument("--batches", type=int, nargs="+", default=BATCHES)
    parser.add_argument("--rates", type=float, nargs="+", default=RATES)
    parser.add_argument("--seeds", type=int, nargs="+", default=SEEDS)
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "critical_batch")
    parser.add_argument("--model", default="cnn1d", help="a model of the catalog (the study's)")
    parser.add_argument("--smoke", action="store_true", help="a tiny grid, for tests")
    parser.add_argument(
        "--append", action="store_true", help="add the rows to --out's runs.csv (more cells)"
    )
    parser.add_argument(
        "--stuck-updates",
        type=int,
        default=0,
        help="a run at chance after 5 epochs goes on to this many updates (a GRU's plateau)",
    )
    args = parser.parse_args()

    from toolkit.training import data

    dataset = data.load(args.dataset, seed=0, num_samples=args.num_samples)
    if args.smoke:
        args.batches, args.rates, args.targets = (32, 128, 512), (0.1, 0.2), [1.8, 1.5]
    rows = []
    for batch in args.batches:
        for rate in args.rates:
            for seed in args.seeds:
                targets = sorted(args.targets, reverse=True)
                rows += run(
                    batch,
                    rate,
                    seed,
                    targets,
                    args.max_steps,
                    dataset,
                    args.model,
                    args.stuck_updates,
                )
                reached = ", ".join(f"{r['target']}: {r['steps']}" for r in rows[-len(targets) :])
                print(
                    f"B={batch:5d} lr={rate:<6} seed={seed}: steps to {reached} "
                    f"({rows[-1]['wall_s']} s)",
                    flush=True,
                )
    runs = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / ("smoke.csv" if args.smoke else "runs.csv")
    if args.append and path.exists():  # a cell run again replaces its earlier rows
        cell = ["batch", "rate", "seed"]
        earlier = pd.read_csv(path).merge(runs[cell].drop_duplicates(), how="left", indicator=True)
        earlier = earlier[earlier.pop("_merge") == "left_only"]
        runs = pd.concat([earlier, runs], ignore_index=True)
    runs.to_csv(path, index=False)
    print("\n" + summarize(runs))
    first_task = (args.dataset, args.num_samples, args.model) == ("mnist1d", NUM_SAMPLES, "cnn1d")
    if not args.smoke and first_task:
        print("\nB_simple through the study's SGD baseline (B=32, lr 0.1 cosine, 15 epochs):")
        print(noise_through_training())
    return 0


if __name__ == "__main__":
    sys.exit(main())
