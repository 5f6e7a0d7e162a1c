"""Submit to first step: the quickstart as a Slurm job against the same launch on this machine.

    .venv/bin/python -m toolkit cluster up --hosts 2 --slurm     # as root: the test cluster
    .venv/bin/python experiments/bench_slurm_startup.py [--repeat 3]

Two timings a repeat, in turn (so machine noise hits each alike), each from
``toolkit.launching.launch.launch`` of the quickstart (2 workers, one epoch) until its first
``train`` event (:func:`bench_startup.to_first_event`):

* ``this machine``: the supervisor and horovodrun, both workers here;
* ``Slurm, 2 nodes``: pre-flight (Slurm answers, the partition fits, the runs root is seen from
  a node: one ``srun``), ``sbatch``, Slurm's scheduling, the job's driver and rendezvous, and
  one rank per node under ``srun``.

The table gives the median seconds of each with their spread and the median ratio of Slurm to
this machine (lower is better); every repeat goes to ``experiments/bench_slurm_startup.csv``.
On the test cluster every "node" shares this machine's 2 cores, so the ratio prices the lab's
Slurm path, not a real cluster's network or file system.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import benchmark_csv  # noqa: E402
from bench_startup import to_first_event  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    bin_dir = Path(sys.executable).parent
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    cases = {
        "this machine": lambda root: to_first_event(root),
        "Slurm, 2 nodes": lambda root: to_first_event(root, slurm={"nodes": 2}),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory(dir=ROOT) as root:  # a root the nodes see
        to_first_event(root)  # a warm-up: page cache, the dataset's cache
        for repeat in range(1, args.repeat + 1):
            for name, case in cases.items():
                times[name].append(case(root))
            print(f"{repeat}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()))
    benchmark_csv.save(
        __file__,
        [
            {"case": name, "repeat": i, "seconds": seconds}
            for name, values in times.items()
            for i, seconds in enumerate(values, 1)
        ],
    )
    local = times["this machine"]
    print(
        f"\nthe quickstart's launch to its first train event, median of {args.repeat} (min-max)\n"
    )
    print("| case | seconds | spread | / this machine |")
    print("| --- | --- | --- | --- |")
    for name, values in times.items():
        ratios = [a / b for a, b in zip(values, local, strict=True)]
        print(
            f"| {name} | {statistics.median(values):.2f} | {min(values):.2f}-{max(values):.2f} "
            f"| {statistics.median(ratios):.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
