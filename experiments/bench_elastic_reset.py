"""What losing a worker costs an elastic run: seconds from the loss to training again.

    .venv/bin/python experiments/bench_elastic_reset.py [--repeat 3] [--only NAME]
        [--lost-after S] [--vanish] [--keep-listed]

Each repeat launches a workload as a user would (``toolkit.launching.launch.launch``, so
``horovodrun --min-np 2 --max-np 3`` and ``toolkit.train``) on the three hosts of the namespace
cluster (``toolkit cluster``, made if none is up, as root), one slot each, at a fixed global
batch of 96, committing every 10 steps and logging every step. Once step 25 is logged the
worker on lbl-h3 is SIGKILLed (as a preempted machine) and its host dropped from the hosts
file, so about 5 steps are lost and trained again by the other two. The run's events give,
per workload, the median over the repeats (min-max):

* reset: from the kill to the first step on two workers, split into *back in fit* (the failed
  collective noticed, the last commit restored, Horovod restarted with two workers, the state
  synced, the run's records and ``elastic`` event written: that event's time) and *first step*
  (the callbacks built again, Keras retracing the step for the new per-worker batch);
* cold start: from horovodrun's start (once the run has its slots) to the first step with
  three workers (processes, imports, data, model, tracing), what restarting the job from a
  checkpoint would cost at least, measured in the same run, and the ratio of the two;
* one step: the median step time before the loss, for scale.

Workloads: the quickstart (MNIST-1D, the 1-D CNN, LARS) and ResNet-20 with LARS on synthetic
32x32x3 images, 40 steps each.

``--lost-after S`` sets ``lost_worker_after_s`` (Gloo's collective timeout, 30 s by default):
a survivor that waits on the dead worker through Horovod's coordinator learns of the loss only
then. ``--vanish`` loses the host instead: the link of lbl-h3 is cut at step 25, so its worker
lives on, unreachable, and no connection is reset; the reset is timed from the cut. The
quickstart only: the timeout dominates. ``--keep-listed`` leaves the lost host in the hosts
file (Horovod blacklists it anyway), rather than dropping it as it is lost.
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

from toolkit.launching import cluster  # noqa: E402

GLOBAL_BATCH, STEPS, COMMIT_EVERY, LOSE_AT, LOST = 96, 40, 10, 25, "lbl-h3"
COMMON = {
    "workers": 3,
    "epochs": 1,
    "batch.global_size": GLOBAL_BATCH,
    "steps_per_epoch": STEPS,
    "logging.every_steps": 1,
    "network_interface": cluster.INTERFACE,
    "elastic": {"min_workers": 2, "max_workers": 3, "discovery": "hosts"},
    "elastic.commit_every_steps": COMMIT_EVERY,
    "elastic.cooldown_s": 0,
}
WORKLOADS = {
    "quickstart": ("experiments/quickstart.yaml", {}),
    "resnet20": (
        "experiments/cifar10_resnet20_lars.yaml",
        {"dataset.name": "synthetic", "dataset.params": {"num_samples": 4096}},
    ),
}


def workload_config(name: str, hosts: Path, lost_after_s: int):
    """The workload's preset with :data:`COMMON`, its own overrides and the hosts file."""
    from toolkit import config

    path, overrides = WORKLOADS[name]
    changes = {**COMMON, **overrides, "elastic.discovery": str(hosts)}
    changes["lost_worker_after_s"] = lost_after_s
    sets = [f"{key}={json.dumps(value)}" for key, value in changes.items()]
    return config.load(ROOT / path, sets)


def one_reset(name: str, lost_after_s: int, vanish: bool, drop: bool) -> dict[str, float]:
    """One elastic run that loses a worker (or, ``vanish``, a host): its timings (see the
    module docstring)."""
    from toolkit.launching import launch
    from toolkit.runs.events import read_events
    from toolkit.runs.rundir import TERMINAL

    names = [h.name for h in cluster.hosts()]
    with tempfile.TemporaryDirectory() as tmp:
        hosts = Path(tmp) / "hosts"
        hosts.write_text("".join(f"{h}:1\n" for h in names))
        config = workload_config(name, hosts, lost_after_s)
        run = launch.launch(config, runs_root_dir=Path(tmp) / "runs")

        def logged() -> int:
            events = read_events(run.events_path) if run.events_path.exists() else None
            return 0 if events is None or "step" not in events else int(events.step.max())

        while logged() < LOSE_AT and run.status()["state"] not in TERMINAL:
            time.sleep(0.01)
        (worker,) = [p for p in run.status()["processes"] if p.get("host") == LOST]
        if drop:
            hosts.write_text("".join(f"{h}:1\n" for h in names if h != LOST))
        lost = time.time()
        if not vanish:
            os.kill(worker["pid"], signal.SIGKILL)
        else:
            subprocess.run(["ip", "link", "set", LOST, "down"], check=True)
        try:
            while run.status()["state"] not in TERMINAL:
                time.sleep(0.2)
        finally:
            if vanish:
                subprocess.run(["ip", "link", "set", LOST, "up"], check=True)
        status, events = run.status(), read_events(run.events_path)
        if status["state"] != "completed":
            sys.exit(f"{name}: {status}\n{run.stdout_path.read_text()[-4000:]}")
    train = events[events.phase == "train"]
    together = train[train.world_size == 3].wall.to_numpy()
    back_in_fit = float(events[events.phase == "elastic"].wall.iloc[0])
    first_on_two = float(train[train.world_size == 2].wall.iloc[0])
    return {
        "reset": first_on_two - lost,
        "back in fit": back_in_fit - lost,
        "first step": first_on_two - back_in_fit,
        "cold start": together[0] - status["launched"],  # horovodrun started (slots taken)
        "one step": statistics.median(np.diff(together)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=sorted(WORKLOADS), help="one workload")
    parser.add_argument("--lost-after", type=int, default=30, metavar="S", help="Gloo's timeout")
    parser.add_argument("--vanish", action="store_true", help="cut lbl-h3's link, not its worker")
    parser.add_argument("--keep-listed", action="store_true", help="lbl-h3 stays in the hosts file")
    args = parser.parse_args()
    made = cluster.describe() is None
    cluster.up(3)
    names = ["quickstart"] if args.vanish else [args.only] if args.only else WORKLOADS
    rows = []
    try:
        for name in names:
            runs = []
            for i in range(args.repeat):
                runs.append(one_reset(name, args.lost_after, args.vanish, not args.keep_listed))
                timings = ", ".join(f"{k} {v:.3f} s" for k, v in runs[-1].items())
                print(f"{name} {i + 1}: {timings}", flush=True)
            rows.append((name, runs))
    finally:
        if made:
            cluster.down()

    lost = "a host's link cut" if args.vanish else "a worker killed"
    lost += ", its host kept in the hosts file" if args.keep_listed else ", its host dropped"
    print(
        f"\n{lost} (step {LOSE_AT} of {STEPS}), lost after {args.lost_after} s, commits every "
        f"{COMMIT_EVERY} steps, "
        f"global batch {GLOBAL_BATCH}, 3 workers to 2; median of {args.repeat} (min-max)\n"
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
