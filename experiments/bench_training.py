"""What ``toolkit.train`` costs over a bare ``model.fit`` of the same model, data and optimizer.

    .venv/bin/python experiments/bench_training.py [--repeat 5] [--epochs 3]

Two workloads, each trained in this process (one worker):

* quickstart: experiments/quickstart.yaml (MNIST-1D, the 1-D CNN, LARS, cosine with warmup);
* resnet20: ResNet-20 with LARS on synthetic 32x32x3 images (CIFAR-10's shape; CIFAR itself
  needs the internet).

For each, ``toolkit.train`` runs with its default logging, checkpointing, trust-ratio and
NaN-guard settings (a run directory, events, checkpoints), and the peer is a bare
``model.fit`` with no callbacks: the same model, optimizer and schedule, the same input
pipeline, evaluation on the test set after every epoch, built and compiled the same way. Each
side is timed from nothing built to the model trained (wall-clock, including tracing). The two
alternate, ``--repeat`` times each, and the table gives the median ratio with its spread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORKLOADS = {
    "quickstart": ("experiments/quickstart.yaml", {"workers": 1}),
    "resnet20": (
        "experiments/cifar10_resnet20_lars.yaml",
        {
            "workers": 1,
            "batch.per_worker": 64,
            "dataset.name": "synthetic",
            "dataset.params": {"num_samples": 2560},
            "schedule.warmup.epochs": 1,
        },
    ),
}


def bare_fit(config) -> None:
    """The peer: the same model, optimizer, data and epochs through ``model.fit``, nothing
    else."""
    import keras

    from toolkit import data, models
    from toolkit.experiment import build_optimizer, steps_per_epoch

    keras.utils.set_random_seed(config.seed)
    dataset = data.load(config.dataset.name, seed=config.seed, **config.dataset.params)
    spe = steps_per_epoch(config, len(dataset.x_train), 1)
    model = models.build(
        config.model.name,
        input_shape=dataset.input_shape,
        num_classes=dataset.num_classes,
        seed=config.seed,
        **config.model.params,
    )
    model.compile(
        optimizer=build_optimizer(config, spe, 1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=False,
    )
    per_worker = config.per_worker_batch(1)
    epochs = [
        data.epoch_dataset(
            dataset.x_train, dataset.y_train, batch_size=per_worker, epoch=e, seed=config.seed
        ).take(spe)
        for e in range(config.epochs)
    ]
    train_data = epochs[0]
    for more in epochs[1:]:
        train_data = train_data.concatenate(more)
    test_data = data.epoch_dataset(
        dataset.x_test, dataset.y_test, batch_size=256, shuffle=False, drop_remainder=False
    )
    model.fit(
        train_data,
        epochs=config.epochs,
        steps_per_epoch=spe,
        validation_data=test_data,
        shuffle=False,
        verbose=0,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--only", choices=sorted(WORKLOADS), help="one workload")
    args = parser.parse_args()

    import yaml

    from toolkit.config import from_mapping, set_path
    from toolkit.train import train

    rows = []
    for name, (path, overrides) in WORKLOADS.items():
        if args.only and name != args.only:
            continue
        raw = yaml.safe_load((ROOT / path).read_text())
        for key, value in {**overrides, "epochs": args.epochs}.items():
            set_path(raw, key, value)
        config = from_mapping(raw)
        ratios, ours, bare = [], [], []
        with tempfile.TemporaryDirectory() as runs:
            for i in range(args.repeat + 1):  # the first pair warms up (imports, data cache)
                begin = time.perf_counter()
                steps = train(config, runs_root=runs, verbose=0).meta()["total_steps"]
                ours_s = time.perf_counter() - begin
                begin = time.perf_counter()
                bare_fit(config)
                bare_s = time.perf_counter() - begin
                if i:
                    ours.append(ours_s)
                    bare.append(bare_s)
                    ratios.append(ours_s / bare_s)
                print(
                    f"{name} {'warm-up' if not i else i}: toolkit.train {ours_s:.2f} s, "
                    f"bare fit {bare_s:.2f} s, ratio {ours_s / bare_s:.3f}",
                    flush=True,
                )
        rows.append((name, steps, ours, bare, ratios))

    print(f"\nIn-process training, {args.epochs} epochs, median of {args.repeat} (min-max)\n")
    print("| workload | steps | toolkit.train (s) | bare fit (s) | ratio | spread |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, steps, ours, bare, ratios in rows:
        print(
            f"| {name} | {steps} | {statistics.median(ours):.2f} "
            f"| {statistics.median(bare):.2f} | {statistics.median(ratios):.3f} "
            f"| {min(ratios):.3f}-{max(ratios):.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
