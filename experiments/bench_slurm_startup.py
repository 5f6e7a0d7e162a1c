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

The table gives the median seconds of each with their spread and the median ratio of Slurm's to
each (lower is better); every repeat goes to ``experiments/bench_slurm_startup.csv``.
On the test cluster every "node" shares this machine's 2 cores, so the ratio prices the lab's
Slurm path, not a real cluster's network or file system.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_startup import in_turn, report, to_first_event  # noqa: E402


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
    with tempfile.TemporaryDirectory(dir=ROOT) as root:  # a root the nodes see
        times = in_turn(cases, args.repeat, root)
    title = "the quickstart's launch to its first train event"
    report(__file__, times, "Slurm, 2 nodes", title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
