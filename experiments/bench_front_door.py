"""How long the front door takes to answer, from outside: each command as a user types it, until
it returns.

    .venv/bin/python experiments/bench_front_door.py [--repeat 5] [--before CHECKOUT]

Cases, each a fresh ``python -m toolkit`` process timed from start to exit, in turn (so machine
noise hits each alike):

* ``refuse a bad field``: ``launch`` of the quickstart with ``--set batch.per_worker=0``;
* ``refuse a bad optimizer value``: the same with ``--set optimizer.params.momentum=-1``, a
  value the optimizer's constructor refuses;
* ``sweep --dry-run``: the study's 93 cells planned and costed;
* ``calibrate --dry-run``: the MLP's calibration grid planned;
* ``launch``: the quickstart on 2 workers, returning once the run is handed to its supervisor
  (the run is stopped afterwards, outside the timing);
* ``import tensorflow``: ``python -c "import tensorflow"``, the peer: what any door that
  imports TensorFlow pays at least.

``--before`` times the same commands in another checkout (e.g. a ``git worktree`` of the
commit before a change, with the same ``.venv``) in the same rounds. The table gives the
median seconds with their spread, lower is better; every repeat goes to
``experiments/bench_front_door.csv``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import benchmark_csv  # noqa: E402

CASES = {
    "refuse a bad field": [
        "launch",
        "experiments/quickstart.yaml",
        "--set",
        "batch.per_worker=0",
    ],
    "refuse a bad optimizer value": [
        "launch",
        "experiments/quickstart.yaml",
        "--set",
        "optimizer.params.momentum=-1",
    ],
    "sweep --dry-run": ["sweep", "experiments/study/study.yaml", "--dry-run"],
    "calibrate --dry-run": ["calibrate", "experiments/mlp_mnist1d.yaml", "--dry-run"],
    "launch": ["launch", "experiments/quickstart.yaml", "--np", "2"],
}


def timed(command: list[str], cwd: Path, env: dict) -> float:
    begin = time.perf_counter()
    subprocess.run(command, cwd=cwd, env=env, capture_output=True, check=False)
    return time.perf_counter() - begin


def toolkit_case(arguments: list[str], checkout: Path, runs: Path):
    """A case timing ``python -m toolkit ARGUMENTS`` in ``checkout``; a launched run gets a
    name of its own and is stopped after the timing."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "TF_CPP_MIN_LOG_LEVEL": "2"}
    toolkit = [sys.executable, "-m", "toolkit", "--runs", str(runs)]
    launched = itertools.count()

    def case() -> float:
        if arguments[0] != "launch":
            return timed([*toolkit, *arguments], checkout, env)
        name = f"bench-{next(launched)}"
        seconds = timed([*toolkit, *arguments, "--name", name], checkout, env)
        subprocess.run([*toolkit, "stop", name], cwd=checkout, env=env, capture_output=True)
        return seconds

    return case


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--before", type=Path, help="another checkout to time alongside")
    args = parser.parse_args()
    bin_dir = Path(sys.executable).parent
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    checkouts = {"now": ROOT, **({"before": args.before.resolve()} if args.before else {})}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = {
            (name, label): toolkit_case(arguments, checkout, Path(tmp) / label)
            for name, arguments in CASES.items()
            for label, checkout in checkouts.items()
        }
        peer = [sys.executable, "-c", "import tensorflow"]
        cases[("import tensorflow", "peer")] = lambda: timed(peer, ROOT, dict(os.environ))
        for case in cases.values():  # warm the page cache and the datasets' cache
            case()
        for repeat in range(1, args.repeat + 1):
            for (name, label), case in cases.items():
                rows.append({"case": name, "code": label, "repeat": repeat, "seconds": case()})
            print(f"round {repeat} of {args.repeat} done", flush=True)
    benchmark_csv.save(__file__, rows)
    print(f"\nseconds to return, median of {args.repeat} (min-max); lower is better\n")
    labels = [*checkouts, "peer"]
    print("| case | " + " | ".join(labels) + " |")
    print("| --- |" + " --- |" * len(labels))
    for name in [*CASES, "import tensorflow"]:
        cells = []
        for label in labels:
            values = [r["seconds"] for r in rows if r["case"] == name and r["code"] == label]
            cells.append(
                f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"
                if values
                else ""
            )
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
