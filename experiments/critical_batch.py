#!/usr/bin/env python
"""Does the measured gradient noise scale predict the critical batch on MNIST-1D?

McCandlish et al. 2018: the steps ``S`` and examples ``E = B·S`` needed to reach a given loss
trade off as ``(S/S_min − 1)(E/E_min − 1) = 1``, i.e. ``S(B) = S_min·(1 + B_crit/B)`` with
``B_crit = E_min/S_min``, and ``B_crit`` is close to the simple noise scale ``B_simple`` measured
at that loss. This script measures both on the study's model and data:

* **The batch grid.** Plain SGD (momentum 0.9, constant rate) on MNIST-1D (20,000 examples, the
  study's 1-D CNN) at batches 16 … 1024, each with the rates in ``RATES``, seeds 0 and 1. A run
  stops when the loss on 2,000 held-out examples (evaluated every ``~512/B`` steps) reaches
  ``--target`` (or gives up: after 40 epochs, on a non-finite loss, or at chance after 5);
  ``S(B)`` is the best rate's mean steps over the seeds. ``S_min`` and ``B_crit``
  come from a least-squares fit of ``S = S_min + S_min·B_crit / B`` (linear in ``1/B``).
* **The noise scale.** In the same runs, once the held-out loss is below ``1.5 × target``,
  ``B_simple`` is measured every 5 steps from two halves of a fresh batch of 128 examples
  (``toolkit.callbacks.HalfBatchNorms``, the one-worker method of ``toolkit.train``). The
  pooled ratio of the mean ``tr Σ`` to the mean ``|G|²`` over every best-rate run is the
  ``B_simple`` at the target loss, with a bootstrap band over runs.

    .venv/bin/python experiments/critical_batch.py            # ~10 minutes on 2 cores
    .venv/bin/python experiments/critical_batch.py --smoke    # seconds

Writes ``experiments/critical_batch/runs.csv`` (one row per run) and prints the summary that
``docs/study.md`` quotes, then ``B_simple`` epoch by epoch through the study's SGD baseline
(rate 0.1 with cosine decay, batch 32), from the run's own ``gns`` events.
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

BATCHES = (16, 32, 64, 128, 256, 512, 1024)
RATES = (0.025, 0.05, 0.1, 0.2, 0.4)
SEEDS = (0, 1)
HELD_OUT = 2000
PROBE_HALF = 64
MAX_EXAMPLES = 40 * 16_000  # 40 epochs of the training set
STUCK_EXAMPLES, STUCK_LOSS = 5 * 16_000, 2.2


def run(batch: int, rate: float, seed: int, target: float, max_steps: int, dataset) -> dict:
    """One SGD run until the held-out loss reaches ``target``: steps taken (``inf`` if not
    within ``max_steps`` or diverged) and the noise-scale measurements near the target."""
    import keras
    import tensorflow as tf

    from toolkit import models, optimizers
    from toolkit.callbacks import HalfBatchNorms
    from toolkit.noise_scale import estimate

    keras.utils.set_random_seed(seed)
    model = models.build(
        "cnn1d", input_shape=dataset.input_shape, num_classes=dataset.num_classes, seed=seed
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
    loss, measured, started = float("inf"), [], time.perf_counter()
    for step in range(1, min(max_steps, MAX_EXAMPLES // batch) + 1):
        if position + batch > len(order):
            order, position = rng.permutation(len(dataset.x_train)), 0
        rows = order[position : position + batch]
        position += batch
        model.train_on_batch(dataset.x_train[rows], dataset.y_train[rows])
        if step % every == 0 or step < every:
            loss = float(held_loss())
            if not np.isfinite(loss) or (step * batch > STUCK_EXAMPLES and loss > STUCK_LOSS):
                break  # diverged, or still at chance (ln 10 = 2.30) after 5 epochs
            if loss <= target:
                return _row(batch, rate, seed, step, loss, measured, started)
        if loss < 1.5 * target and step % 5 == 0:
            small, big = halves(model)
            measured.append(estimate(small, big, PROBE_HALF, 2 * PROBE_HALF))
    return _row(batch, rate, seed, float("inf"), loss, measured, started)


def _row(batch, rate, seed, steps, loss, measured, started) -> dict:
    grad_sq, trace = (np.array(v) for v in zip(*measured, strict=True)) if measured else ([], [])
    return {
        "batch": batch,
        "rate": rate,
        "seed": seed,
        "steps": steps,
        "held_out_loss": loss,
        "measurements": len(measured),
        "grad_sq_sum": float(np.sum(grad_sq)),
        "trace_sigma_sum": float(np.sum(trace)),
        "wall_s": round(time.perf_counter() - started, 2),
    }


def fit_tradeoff(batches: np.ndarray, steps: np.ndarray) -> tuple[float, float]:
    """``(S_min, B_crit)`` of ``S = S_min·(1 + B_crit/B)`` by least squares in ``1/B``."""
    slope, intercept = np.polyfit(1 / batches, steps, 1)
    return intercept, slope / intercept


def summarize(runs: pd.DataFrame) -> str:
    done = runs[np.isfinite(runs.steps)]
    by_rate = done.groupby(["batch", "rate"]).agg(steps=("steps", "mean"), n=("steps", "size"))
    by_rate = by_rate[by_rate.n == runs.seed.nunique()]  # every seed reached the target
    best = by_rate.reset_index().sort_values("steps").groupby("batch").first().reset_index()
    s_min, b_crit = fit_tradeoff(best.batch.to_numpy(float), best.steps.to_numpy(float))
    chosen = runs.merge(best[["batch", "rate"]], on=["batch", "rate"])
    chosen = chosen[chosen.measurements > 0]
    b_simple = chosen.trace_sigma_sum.sum() / chosen.grad_sq_sum.sum()
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(chosen), size=(2000, len(chosen)))
    boot = chosen.trace_sigma_sum.to_numpy()[picks].sum(1) / chosen.grad_sq_sum.to_numpy()[
        picks
    ].sum(1)
    low, high = np.percentile(boot, [10, 90])
    lines = [
        "| batch | best rate | steps to target (mean over seeds) | examples |",
        "|---" * 4 + "|",
    ]
    for row in best.itertuples():
        lines.append(
            f"| {row.batch} | {row.rate} | {row.steps:,.0f} | {row.batch * row.steps:,.0f} |"
        )
    lines += [
        "",
        f"fit S = S_min (1 + B_crit / B): S_min = {s_min:,.0f} steps, B_crit = {b_crit:,.0f}",
        f"B_simple near the target loss: {b_simple:,.0f} (10-90% bootstrap over runs: "
        f"{low:,.0f}-{high:,.0f}; {int(chosen.measurements.sum())} measurements in "
        f"{len(chosen)} runs)",
        f"B_crit / B_simple = {b_crit / b_simple:.2f}: "
        + ("within 2x" if 0.5 <= b_crit / b_simple <= 2 else "NOT within 2x"),
    ]
    return "\n".join(lines)


def noise_through_training(batch: int = 32, rate: float = 0.1, epochs: int = 15) -> str:
    """``B_simple`` through a run of the study's SGD baseline (cosine decay, coupled weight
    decay 1e-4), trained by ``toolkit.train`` with its own noise-scale events (one worker:
    halves of an extra batch of ``batch``)."""
    import tempfile

    from toolkit.config import from_mapping
    from toolkit.events import read_events
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
    gns, evals = events[events.phase == "gns"], events[events.phase == "eval"]
    lines = ["| epoch | test loss | B_simple (ratio of means over the epoch) |", "|---|---|---|"]
    for row in evals.itertuples():
        part = gns[(gns.epoch > row.epoch - 1) & (gns.epoch <= row.epoch)]
        grad_sq = part.grad_sq_step.mean()
        ratio = part.trace_sigma_step.mean() / grad_sq
        shown = f"{ratio:,.0f}" if grad_sq > 0 else "n/a (mean ‖G‖² ≤ 0)"
        lines.append(f"| {row.epoch:.0f} | {row.loss:.3f} | {shown} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=float, default=0.6, help="held-out loss to reach")
    parser.add_argument("--max-steps", type=int, default=8000)
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "critical_batch")
    parser.add_argument("--smoke", action="store_true", help="a tiny grid, for tests")
    args = parser.parse_args()

    from toolkit import data

    dataset = data.load("mnist1d", seed=0, num_samples=20000)
    batches, rates, seeds = (BATCHES, RATES, SEEDS)
    if args.smoke:
        batches, rates, seeds, args.target = (32, 128, 512), (0.1, 0.2), (0,), 1.5
    rows = []
    for batch in batches:
        for rate in rates:
            for seed in seeds:
                rows.append(run(batch, rate, seed, args.target, args.max_steps, dataset))
                r = rows[-1]
                print(
                    f"B={batch:5d} lr={rate:<6} seed={seed}: {r['steps']} steps "
                    f"({r['wall_s']} s, {r['measurements']} noise measurements)",
                    flush=True,
                )
    runs = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(args.out / ("smoke.csv" if args.smoke else "runs.csv"), index=False)
    print(f"\ntarget held-out loss {args.target}\n" + summarize(runs))
    if not args.smoke:
        print("\nB_simple through the study's SGD baseline (B=32, lr 0.1 cosine, 15 epochs):")
        print(noise_through_training())
    return 0


if __name__ == "__main__":
    sys.exit(main())
