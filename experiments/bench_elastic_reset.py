"""What losing a worker costs an elastic run: seconds from the loss to training again.

    .venv/bin/python experiments/bench_elastic_reset.py [--repeat 3] [--only NAME]

Each repeat starts ``horovodrun --min-np 1 --max-np 2`` with one slot on each of two hosts,
``localhost`` and ``127.0.0.1`` (this machine under two names: Horovod blacklists a host whose
worker died, so the survivor must be on another). The workers train a workload with
:mod:`toolkit.elastic` at a fixed global batch of 64, committing every 10 steps; the worker on
the second host kills itself (SIGKILL, as a preempted machine) before step 25, so 5 steps are
lost and trained again. The survivor records when each step ended and when its fit function was
re-entered; the table gives, per workload, the median over the repeats (min-max):

* reset: from the kill to the survivor's first step alone, split into *back in fit* (the
  failed collective noticed, the last commit restored, Horovod restarted with one worker, the
  state synced) and *first step* (Keras retracing the step for the new per-worker batch);
* cold start: from launching ``horovodrun`` to the first step with two workers (processes,
  imports, data, model, tracing), what restarting the job from a checkpoint would cost at
  least, measured in the same run as the peer, and the ratio of the two;
* one step: the median step time before the loss, for scale.

Workloads: the quickstart (MNIST-1D, the 1-D CNN, LARS) and ResNet-20 with LARS on synthetic
32x32x3 images, 40 steps each.

``--vanish S`` loses a host instead: on two hosts of the namespace cluster (``toolkit
cluster``, made if none is up, as root), the link of the second is cut before step 25, so its
worker lives on, unreachable, and no connection is reset. The survivor learns of it when a
collective times out after ``S`` s (``horovodrun --gloo-timeout-seconds S``); the reset is
timed from the cut. The quickstart only: the timeout dominates.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from toolkit import cluster  # noqa: E402

GLOBAL_BATCH, STEPS, COMMIT_EVERY, DIE_AT = 64, 40, 10, 25
COMMON = {
    "workers": 2,
    "epochs": 1,
    "batch.global_size": GLOBAL_BATCH,
    "steps_per_epoch": STEPS,
}
WORKLOADS = {
    "quickstart": ("experiments/quickstart.yaml", {}),
    "resnet20": (
        "experiments/cifar10_resnet20_lars.yaml",
        {"dataset.name": "synthetic", "dataset.params": {"num_samples": 4096}},
    ),
}


def workload_config(name: str):
    """The workload's preset with :data:`COMMON` and its own overrides applied."""
    from toolkit import config

    path, overrides = WORKLOADS[name]
    sets = [f"{key}={json.dumps(value)}" for key, value in {**COMMON, **overrides}.items()]
    return config.load(ROOT / path, sets)


def worker(name: str, out: Path, doomed_host: str, vanish: bool) -> None:
    """Under horovodrun: the elastic fit. Before ``DIE_AT`` the worker on ``doomed_host`` dies
    or (``vanish``) says it is time to cut its host's link."""
    import keras

    from toolkit import distributed, elastic
    from toolkit.experiment import (
        build_model,
        build_optimizer,
        load_dataset,
        steps_per_epoch,
        train_batches,
    )

    distributed.init()
    config = workload_config(name)
    keras.utils.set_random_seed(config.seed)
    dataset = load_dataset(config)
    spe = steps_per_epoch(config, len(dataset.x_train), 2)
    model = build_model(config, dataset)
    model.compile(
        optimizer=distributed.DistributedOptimizer(build_optimizer(config, spe, 2)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    state = elastic.TrainingState(model, epoch=0, batch=0)
    doomed = os.environ["HOROVOD_HOSTNAME"] == doomed_host
    marks: list[tuple[str, float, int]] = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if doomed and state.batch == DIE_AT and not (out / "lost").exists():
                (out / "lost").write_text(repr(time.time()))
                if vanish:
                    time.sleep(1.0)  # the link is cut meanwhile; the step waits in vain
                else:
                    os.kill(os.getpid(), signal.SIGKILL)

        def on_train_batch_end(self, batch, logs=None):
            marks.append(("step", time.time(), distributed.size()))

    @elastic.run
    def fit(state: elastic.TrainingState) -> None:
        marks.append(("fit", time.time(), distributed.size()))
        world, rank = distributed.size(), distributed.rank()
        while state.epoch < config.epochs:
            batches = train_batches(config, dataset, state.epoch, world, rank).skip(state.batch)
            model.fit(
                batches,
                initial_epoch=state.epoch,
                epochs=state.epoch + 1,
                steps_per_epoch=spe - state.batch,
                verbose=0,
                callbacks=[elastic.Committer(state, COMMIT_EVERY), Clock()],
            )

    fit(state)
    (out / "marks.json").write_text(json.dumps(marks))


def one_reset(name: str, vanish_s: int | None = None) -> dict[str, float]:
    """One elastic run that loses a worker (or, ``vanish_s``, a host): its timings (see the
    module docstring)."""
    hosts = ["localhost", "127.0.0.1"] if vanish_s is None else [h.name for h in cluster.hosts()]
    survivor, doomed = hosts[:2]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        discover = out / "discover.sh"
        discover.write_text(f"#!/bin/sh\necho {survivor}:1\necho {doomed}:1\n")
        discover.chmod(0o755)
        horovodrun = Path(sys.executable).with_name("horovodrun")
        command = [str(horovodrun), "--gloo", "-np", "2", "--min-np", "1", "--max-np", "2"]
        command += ["--host-discovery-script", str(discover)]
        if vanish_s is not None:
            command += ["--network-interfaces", cluster.INTERFACE]
            command += ["--gloo-timeout-seconds", str(vanish_s)]
        command += [sys.executable, __file__, "--worker", name, str(out), doomed]
        command += ["vanish" if vanish_s is not None else "kill"]
        launched = time.time()
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if vanish_s is not None:
            while not (out / "lost").exists() and child.poll() is None:
                time.sleep(0.02)
            subprocess.run(["ip", "link", "set", doomed, "down"], check=True)
            lost = time.time()
        try:
            output = child.communicate(timeout=600)[0].decode(errors="replace")
        finally:
            if vanish_s is not None:
                subprocess.run(["ip", "link", "set", doomed, "up"], check=True)
        if child.returncode:
            sys.exit(f"{name}: horovodrun failed\n{output[-4000:]}")
        if vanish_s is None:
            lost = float((out / "lost").read_text())
        marks = json.loads((out / "marks.json").read_text())
    steps = [(t, world) for kind, t, world in marks if kind == "step"]
    together = [t for t, world in steps if world == 2]
    back_in_fit = next(t for kind, t, world in marks if kind == "fit" and world == 1)
    first_alone = next(t for t, world in steps if world == 1)
    return {
        "reset": first_alone - lost,
        "back in fit": back_in_fit - lost,
        "first step": first_alone - back_in_fit,
        "cold start": together[0] - launched,
        "one step": statistics.median(np.diff(together)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=sorted(WORKLOADS), help="one workload")
    parser.add_argument(
        "--vanish", type=int, metavar="S", help="cut a cluster host's link; Gloo's timeout S s"
    )
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        name, out, doomed, mode = args.worker
        worker(name, Path(out), doomed, mode == "vanish")
        return 0
    made = args.vanish is not None and cluster.describe() is None
    if args.vanish is not None:
        cluster.up(2)
    names = ["quickstart"] if args.vanish is not None else [args.only] if args.only else WORKLOADS
    rows = []
    try:
        for name in names:
            runs = []
            for i in range(args.repeat):
                runs.append(one_reset(name, args.vanish))
                timings = ", ".join(f"{k} {v:.3f} s" for k, v in runs[-1].items())
                print(f"{name} {i + 1}: {timings}", flush=True)
            rows.append((name, runs))
    finally:
        if made:
            cluster.down()

    lost = f"a host's link cut ({args.vanish} s timeout)" if args.vanish else "a worker killed"
    print(
        f"\n{lost} at step {DIE_AT} of {STEPS}, commits every {COMMIT_EVERY} steps, "
        f"global batch {GLOBAL_BATCH}, 2 workers to 1; median of {args.repeat} (min-max)\n"
    )
    columns = ["reset", "back in fit", "first step", "cold start", "one step"]
    print(f"| workload | {' | '.join(c + ' (s)' for c in columns)} | reset / cold start |")
    print("| --- " * (len(columns) + 2) + "|")
    for name, runs in rows:
        cells = []
        for column in columns:
            values = [r[column] for r in runs]
            cells.append(f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})")
        ratios = [r["reset"] / r["cold start"] for r in runs]
        ratio = f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
        print(f"| {name} | {' | '.join(cells)} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
