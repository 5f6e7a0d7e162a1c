"""The two-worker quickstart across two hosts, against the same on one host.

    python -m toolkit cluster up            # then, optionally, cluster shape --bandwidth 1gbit
    .venv/bin/python experiments/bench_hosts.py [--repeat 3] [--epochs 20]

Both sides run through the product's own door (``toolkit.launching.launch``: supervisor, horovodrun,
ssh to each host) on the namespace cluster: "one host" puts both workers on lbl-h1, "two
hosts" one on lbl-h1 and one on lbl-h2. Both reach their workers over ssh, so they differ only
in whether the allreduce crosses the link. Pairs alternate which side goes first. The table
gives each side's median training throughput (the median samples/s its train events logged)
with its spread over repeats, the median wall time from launch to completed, and the median
ratio two hosts / one host with its spread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"

from toolkit import config as config_lib  # noqa: E402
from toolkit.launching import cluster  # noqa: E402  (after the path is set)
from toolkit.launching import launch as launcher  # noqa: E402
from toolkit.runs.rundir import TERMINAL  # noqa: E402
from toolkit.runs.table import summary  # noqa: E402

SIDES = {"one host": "lbl-h1:2", "two hosts": "lbl-h1:1,lbl-h2:1"}


def timed_run(config, hosts: str, runs: Path, run_id: str) -> tuple[float, float]:
    """(samples/s, wall seconds) of one completed run of ``config`` on ``hosts``."""
    start = time.perf_counter()
    run = launcher.launch(config, hosts=hosts, runs_root_dir=runs, run_id=run_id)
    while (state := run.status()["state"]) not in TERMINAL:
        time.sleep(0.5)
    if state != "completed":
        raise SystemExit(f"{run_id}: {state}; see {run.stdout_path}")
    return summary(run)["samples_per_sec"], time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="pairs")
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    if len(cluster.hosts()) < 2:
        parser.error("needs the namespace cluster: python -m toolkit cluster up")
    config = config_lib.load(ROOT / "experiments" / "quickstart.yaml")
    config = config.model_copy(update={"epochs": args.epochs})
    speed = {side: [] for side in SIDES}
    wall = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(dir="/tmp") as runs:
        for pair in range(args.repeat):
            order = list(SIDES) if pair % 2 == 0 else list(SIDES)[::-1]
            for side in order:
                samples, seconds = timed_run(config, SIDES[side], Path(runs), f"{pair}-{side[:3]}")
                speed[side].append(samples)
                wall[side].append(seconds)
                print(f"pair {pair + 1}: {side}: {samples:,.0f} samples/s, {seconds:.1f} s")
    ratios = [two / one for one, two in zip(speed["one host"], speed["two hosts"], strict=True)]
    print(f"\nquickstart, {args.epochs} epochs, 2 workers, {args.repeat} pairs, {cluster.links()}")
    print("| placement | hosts | samples/s (median) | spread | wall s (median) |")
    print("| --- | --- | --- | --- | --- |")
    for side, hosts in SIDES.items():
        values = speed[side]
        print(
            f"| {side} | {hosts} | {statistics.median(values):,.0f} | "
            f"{min(values):,.0f}-{max(values):,.0f} | {statistics.median(wall[side]):.1f} |"
        )
    print(
        f"\ntwo hosts / one host: {statistics.median(ratios):.3f}x "
        f"({min(ratios):.3f}-{max(ratios):.3f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
