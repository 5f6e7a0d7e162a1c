"""What ``toolkit.train`` costs over a bare ``model.fit`` of the same model, data and optimizer.

    .venv/bin/python experiments/bench_training.py [--repeat 5] [--epochs N] [--only NAME]...
        [--matched]
    KERAS_BACKEND=jax .venv/bin/python experiments/bench_training.py --only quickstart
    .venv/bin/python experiments/bench_training.py --horovod [--repeat 5] [--epochs N]
    .venv/bin/python experiments/bench_training.py --gpu [--repeat 3]

Two workloads, each trained in this process (one worker):

* quickstart: experiments/quickstart.yaml (MNIST-1D, the 1-D CNN, LARS, cosine with warmup,
  20 epochs), and the same with the noise scale off;
* resnet20: ResNet-20 with LARS on synthetic 32x32x3 images (CIFAR-10's shape; CIFAR itself
  needs the internet), 2 epochs of 128 steps of 64 images, and the same with the noise scale
  off.

For each, ``toolkit.train`` runs with its default logging, checkpointing, trust-ratio and
NaN-guard settings (a run directory, events, checkpoints), and the peer is a bare
``model.fit`` with no callbacks: the same model, optimizer and schedule, the same input
pipeline, evaluation on the test set after every epoch, built and compiled the same way. Each
side is timed from nothing built to the model trained (wall-clock, including tracing). The two
run in pairs, ``--repeat`` of them after one warm-up pair, which goes first swapping every
pair; the table gives the median of each side and the median ratio with its spread (lower is
better: below 1, ``toolkit.train`` is the faster), and every pair goes to
``experiments/bench_training[_jax|_torch][_horovod|_matched|_gpu].csv``
(:mod:`benchmark_csv`). On JAX and PyTorch both sides compile as ``toolkit.train`` does there
(the backend's ``jit_compile``: XLA on JAX).
``toolkit.train`` runs several steps per call of Keras's compiled function (its
``steps_per_execution``, chosen from the event intervals); the bare fit runs Keras's default
of one, or with ``--matched`` as many as ``toolkit.train``, which isolates what the callbacks
cost.

With ``--gpu`` (a GPU machine) the workloads are ResNet-50 on synthetic 224x224x3 images at batch
256 in mixed precision, with SGD and with LARS, 2 epochs of 20 steps; both sides then set the
``mixed_float16`` policy and scale the loss, as ``toolkit.train`` does.

With ``--horovod`` the quickstart runs on 2 Gloo workers (``horovodrun``, started by this
script), and the peer is Horovod's own recipe written out: a compiled step under
``hvd.DistributedGradientTape`` (given ``v.value`` for Keras 3 variables), the variables
broadcast from rank 0 after the first step, the same optimizer, shards and per-epoch test
evaluation. Times are rank 0's.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QUICKSTART = "experiments/quickstart.yaml"
RESNET20 = "experiments/cifar10_resnet20_lars.yaml"
RESNET50 = "experiments/resnet50_synthetic.yaml"
RESNET20_SYNTHETIC = {
    "workers": 1,
    "epochs": 2,
    "batch.per_worker": 64,
    "dataset.name": "synthetic",
    "dataset.params": {"num_samples": 10_240},
    "schedule.warmup.epochs": 1,
}
NOISE_SCALE_OFF = {"logging.noise_scale_every_steps": 0}
ADASCALE_AT_ONE = {"lr_scaling.rule": "adascale", "schedule.warmup.epochs": 0}
WORKLOADS = {
    "quickstart": (QUICKSTART, {"workers": 1}),
    "quickstart, noise scale off": (QUICKSTART, {"workers": 1, **NOISE_SCALE_OFF}),
    "quickstart, AdaScale at S=1": (
        QUICKSTART,
        {"workers": 1, **ADASCALE_AT_ONE, "lr_scaling.base_batch": 32},
    ),
    "resnet20": (RESNET20, RESNET20_SYNTHETIC),
    "resnet20, noise scale off": (RESNET20, {**RESNET20_SYNTHETIC, **NOISE_SCALE_OFF}),
    "resnet20, AdaScale at S=1": (
        RESNET20,
        {**RESNET20_SYNTHETIC, **ADASCALE_AT_ONE, "lr_scaling.base_batch": 64},
    ),
}
"""name -> (config, overrides). The quickstart keeps its own 20 epochs; with one worker the
noise scale is measured from an extra batch every 100 updates (``auto``), a measurement rather
than an overhead, so a second row of each shows the run without it. A third runs AdaScale with
its base batch equal to the batch (a gain of 1: the same updates as the peer's), which measures
the noise before every update: what a one-worker AdaScale costs per update."""

RESNET50_GPU = {
    "workers": 1,
    "epochs": 2,
    "steps_per_epoch": 20,
    "batch.per_worker": 256,
    "precision": "mixed_float16",
    "dataset.params.num_samples": 6400,
    "logging.every_steps": 5,
}
GPU_WORKLOADS = {
    "resnet50 SGD, GPU": (RESNET50, {**RESNET50_GPU, "optimizer.name": "sgd"}),
    "resnet50 LARS, GPU": (RESNET50, RESNET50_GPU),
}
"""The same on a GPU (``--gpu``): ResNet-50 at batch 256 in mixed precision, SGD and LARS."""


def bare_fit(config, matched: bool = False) -> None:
    """The peer: the same model, optimizer, data and epochs through ``model.fit``, nothing
    else; at Keras's default of one step per execution, or (``matched``) at as many as
    ``toolkit.train`` runs, which leaves only the cost of its callbacks between the two. An
    AdaScale config at ``S = 1`` is fitted with its base rule: the same updates at the same
    rates."""
    import keras

    if config.lr_scaling.rule == "adascale":
        scaling = config.lr_scaling.model_copy(update={"rule": "none"})
        config = config.model_copy(update={"lr_scaling": scaling})

    from toolkit import backends
    from toolkit.optimizers import applies_trust_ratios
    from toolkit.plan import RunPlan
    from toolkit.training.experiment import (
        build_model,
        build_optimizer,
        load_dataset,
        test_batches,
        train_batches,
    )

    keras.utils.set_random_seed(config.seed)
    keras.config.set_dtype_policy(config.precision)
    dataset = load_dataset(config)
    plan = RunPlan.of(config, len(dataset.x_train), 1)
    model = build_model(config, dataset)
    optimizer = build_optimizer(config, plan)
    per_execution = plan.steps_per_execution(applies_trust_ratios(optimizer))
    if config.precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=backends.current().jit_compile,  # as toolkit.train compiles (JAX: XLA)
        steps_per_execution=per_execution if matched else 1,
    )
    model.fit(
        train_batches(plan, dataset, 0, seed=config.seed, last=config.epochs),
        epochs=config.epochs,
        steps_per_epoch=plan.steps_per_epoch,
        validation_data=test_batches(dataset),
        shuffle=False,
        verbose=0,
    )


def horovod_fit(config) -> None:
    """The distributed peer: Horovod's documented TensorFlow 2 loop, nothing of ours but the
    model, optimizer and data."""
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    from toolkit.plan import RunPlan
    from toolkit.training.experiment import (
        build_model,
        build_optimizer,
        load_dataset,
        test_batches,
        train_batches,
    )

    hvd.init()
    world = hvd.size()
    keras.utils.set_random_seed(config.seed)
    dataset = load_dataset(config)
    plan = RunPlan.of(config, len(dataset.x_train), world)
    model = build_model(config, dataset)
    optimizer = build_optimizer(config, plan)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    accuracy = keras.metrics.SparseCategoricalAccuracy()

    @tf.function
    def train_step(x, y, first: bool):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, logits)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, [v.value for v in model.trainable_variables])
        optimizer.apply(grads, model.trainable_variables)
        accuracy.update_state(y, logits)
        if first:  # Horovod's recipe: broadcast once the optimizer's slots exist
            hvd.broadcast_variables([v.value for v in model.variables], root_rank=0)
            hvd.broadcast_variables([v.value for v in optimizer.variables], root_rank=0)
        return loss

    @tf.function
    def test_step(x, y):
        logits = model(x, training=False)
        return loss_fn(y, logits), tf.reduce_sum(tf.cast(tf.argmax(logits, 1) == y, tf.float32))

    for epoch in range(config.epochs):
        shard = train_batches(plan, dataset, epoch, seed=config.seed, rank=hvd.rank())
        for i, (x, y) in enumerate(shard):
            train_step(x, y, epoch == 0 and i == 0)
        for x, y in test_batches(dataset):
            test_step(x, tf.cast(y, tf.int64))
        hvd.allreduce(tf.constant(accuracy.result()), op=hvd.Average)  # the epoch's metrics


def horovod_worker(repeat: int, epochs: int | None) -> None:
    """Under horovodrun: toolkit.train and :func:`horovod_fit` alternately, timed on rank 0."""
    import horovod.tensorflow as hvd

    config = workload_config("quickstart", {"workers": 2}, epochs)
    hvd.init()
    ours, peer = alternate(
        config, horovod_fit, repeat, "quickstart, 2 workers", "Horovod loop", hvd.join, hvd.rank()
    )
    if hvd.rank() == 0:
        print(f"\n2 Gloo workers, {config.epochs} epochs, median of {repeat} (min-max)\n")
        rows = [("quickstart, 2 workers", ours, peer)]
        table("Horovod loop", rows)
        record(rows, "Horovod loop", "horovod")


def alternate(config, peer, repeat: int, name: str, peer_name: str, barrier=None, rank=0):
    """Seconds of ``toolkit.train(config)`` and of ``peer(config)``, ``repeat`` pairs after a
    warm-up pair (imports, data caches), the order swapped every pair (ABBA) so neither side
    always runs second; ``barrier`` lines the workers up before each, and only rank 0 prints."""
    from toolkit.train import train

    times: dict[str, list[float]] = {"ours": [], "peer": []}
    with tempfile.TemporaryDirectory() as runs:
        sides = {
            "ours": lambda: train(config, runs_root=runs, verbose=0),
            "peer": lambda: peer(config),
        }
        for i in range(repeat + 1):
            took = {}
            for side in ("ours", "peer") if i % 2 == 0 else ("peer", "ours"):
                if barrier is not None:
                    barrier()
                begin = time.perf_counter()
                sides[side]()
                took[side] = time.perf_counter() - begin
            if i:
                for side in times:
                    times[side].append(took[side])
            if rank == 0:
                print(
                    f"{name} {'warm-up' if not i else i}: toolkit.train {took['ours']:.2f} s, "
                    f"{peer_name} {took['peer']:.2f} s, ratio {took['ours'] / took['peer']:.3f}",
                    flush=True,
                )
    return times["ours"], times["peer"]


def workload_config(name: str, overrides: dict, epochs: int | None):
    """A workload's config with ``overrides`` (and ``epochs``, if given) applied."""
    import yaml

    from toolkit.config import from_mapping, set_path

    path = (WORKLOADS | GPU_WORKLOADS)[name][0]
    raw = yaml.safe_load((ROOT / path).read_text())
    for key, value in {**overrides, **({"epochs": epochs} if epochs else {})}.items():
        set_path(raw, key, value)
    return from_mapping(raw)


def table(peer: str, rows: list[tuple[str, list[float], list[float]]]) -> None:
    """The markdown table: median seconds of each side, the median of the pairs' ratios with
    their spread, and best against best (stalls only ever add time, so the fastest run of each
    side is the steadiest comparison on a shared machine)."""
    print(f"| workload | toolkit.train (s) | {peer} (s) | ratio | spread | best / best |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, ours, theirs in rows:
        ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
        print(
            f"| {name} | {statistics.median(ours):.2f} | {statistics.median(theirs):.2f} "
            f"| {statistics.median(ratios):.3f} | {min(ratios):.3f}-{max(ratios):.3f} "
            f"| {min(ours) / min(theirs):.3f} |"
        )


def record(rows: list[tuple[str, list[float], list[float]]], peer: str, variant: str) -> None:
    """Every pair of every workload, as the CSV beside this script."""
    import benchmark_csv

    benchmark_csv.save(
        __file__,
        [
            {
                "workload": name,
                "peer": peer,
                "pair": pair,
                "toolkit_train_s": a,
                "peer_s": b,
                "ratio": a / b,
            }
            for name, ours, theirs in rows
            for pair, (a, b) in enumerate(zip(ours, theirs, strict=True), 1)
        ],
        variant,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--epochs", type=int, help="for every workload (default: its own)")
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(WORKLOADS | GPU_WORKLOADS),
        help="a workload (repeat for several; default: every one)",
    )
    parser.add_argument("--gpu", action="store_true", help="the GPU workloads (ResNet-50)")
    parser.add_argument(
        "--matched",
        action="store_true",
        help="the bare fit at toolkit.train's steps per execution (default: Keras's 1)",
    )
    parser.add_argument("--horovod", action="store_true", help="2 workers against Horovod's loop")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        horovod_worker(args.repeat, args.epochs)
        return 0
    if args.horovod:
        horovodrun = Path(sys.executable).with_name("horovodrun")
        command = [str(horovodrun), "--gloo", "-np", "2", "-H", "localhost:2", sys.executable]
        command += [__file__, "--worker", "--repeat", str(args.repeat)]
        command += ["--epochs", str(args.epochs)] if args.epochs else []
        return subprocess.run(command, check=False).returncode

    rows = []
    workloads = (
        GPU_WORKLOADS if args.gpu or set(args.only or ()) & set(GPU_WORKLOADS) else WORKLOADS
    )
    for name, (_, overrides) in workloads.items():
        if args.only and name not in args.only:
            continue
        config = workload_config(name, overrides, args.epochs)
        peer = functools.partial(bare_fit, matched=args.matched)
        ours, bare = alternate(config, peer, args.repeat, name, "bare fit")
        rows.append((name, ours, bare))
    print(f"\nIn-process training, one worker, median of {args.repeat} (min-max)\n")
    peer = "bare fit, matched" if args.matched else "bare fit"
    table(peer, rows)
    from toolkit import backends

    backend = backends.requested()  # TensorFlow's rows keep the files' original names
    kind = "gpu" if args.gpu else "matched" if args.matched else ""
    record(rows, peer, "_".join(p for p in (backend != "tensorflow" and backend, kind) if p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
