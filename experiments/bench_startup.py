"""How long a launch takes to its first step, against the floor of starting Horovod at all.

    .venv/bin/python experiments/bench_startup.py [--repeat 5]

Three timings a repeat, in turn (so machine noise hits each alike):

* ``horovodrun``: Horovod's own launcher starting 2 Gloo workers that import TensorFlow and
  Horovod and call ``hvd.init()``, then exit: the floor any Horovod run pays;
* ``horovodrun, probe answered``: the same through :mod:`toolkit.launching.horovodrun`, the
  launcher the lab runs, which answers Horovod's build probe instead of importing TensorFlow
  to ask it;
* ``launch to first event``: ``toolkit.launching.launch.launch`` of the quickstart (2 workers,
  one epoch) from this process, until its first ``train`` event is written (5 steps in): the
  supervisor, the launcher, the workers' imports, data, model, compile and the first
  execution's trace.

The table gives the median seconds of each with their spread and the median ratio of the
launch to each floor (lower is better); every repeat goes to ``experiments/bench_startup.csv``.
"""

from __future__ import annotations

import argparse
import json
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

import benchmark_csv  # noqa: E402

from toolkit.launching import horovodrun  # noqa: E402

WORKER = "import tensorflow, horovod.tensorflow as hvd; hvd.init()"


def bare(launcher: list[str]) -> float:
    """Seconds for ``launcher`` to start 2 workers that import TensorFlow and init Horovod."""
    command = [*launcher, "--gloo", "-np", "2", "-H", "localhost:2", sys.executable, "-c", WORKER]
    begin = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - begin


def to_first_event(root: str, **where) -> float:
    """Seconds from ``launch.launch`` of the quickstart to its first train event (``where``:
    the launch's placement, e.g. ``slurm={"nodes": 2}``)."""
    from toolkit import config as config_lib
    from toolkit.launching import launch
    from toolkit.runs import monitor

    config = config_lib.load(ROOT / "experiments" / "quickstart.yaml", ["epochs=1"])
    begin = time.time()
    run = launch.launch(config, runs_root_dir=root, **where)
    while True:
        lines = run.events_path.read_text().splitlines() if run.events_path.exists() else []
        train = [json.loads(line) for line in lines if '"train"' in line]
        if train:
            first = train[0]["wall"] - begin
            break
        time.sleep(0.05)
    monitor.follow(run, progress=False)  # let it end before the next repeat
    return first


def in_turn(cases: dict, repeat: int, root: str) -> dict[str, list[float]]:
    """Each case's seconds, ``repeat`` times, the cases in turn (so machine noise hits each
    alike), after one launch to warm the page cache and the dataset's cache."""
    to_first_event(root)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for index in range(1, repeat + 1):
        for name, case in cases.items():
            times[name].append(case(root))
        print(f"{index}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()))
    return times


def report(script: str, times: dict[str, list[float]], numerator: str, title: str) -> None:
    """Save every repeat beside ``script`` and print each case's median seconds, spread and
    the median ratio of ``numerator``'s seconds to its (lower is better)."""
    benchmark_csv.save(
        script,
        [
            {"case": name, "repeat": i, "seconds": seconds}
            for name, values in times.items()
            for i, seconds in enumerate(values, 1)
        ],
    )
    top = times[numerator]
    print(f"\n{title}, median of {len(top)} (min-max)\n")
    print(f"| case | seconds | spread | {numerator} / this |")
    print("| --- | --- | --- | --- |")
    for name, values in times.items():
        ratios = [a / b for a, b in zip(top, values, strict=True)]
        print(
            f"| {name} | {statistics.median(values):.2f} | {min(values):.2f}-{max(values):.2f} "
            f"| {statistics.median(ratios):.2f} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    bin_dir = Path(sys.executable).parent
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    cases = {
        "horovodrun": lambda root: bare([str(bin_dir / "horovodrun")]),
        "horovodrun, probe answered": lambda root: bare(horovodrun.COMMAND),
        "launch to first event": to_first_event,
    }
    with tempfile.TemporaryDirectory() as root:
        times = in_turn(cases, args.repeat, root)
    report(__file__, times, "launch to first event", "2 Gloo workers on this host")
    return 0


if __name__ == "__main__":
    sys.exit(main())
