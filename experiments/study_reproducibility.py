"""Do the committed study's cells reproduce? Seed 0, one worker, each cell run several ways beside
its value in ``experiments/study/results.csv`` (docs/notes/study.md, "What a rerun reproduces").

Ways: ``in-process`` twice (``toolkit.train.train`` here: is a rerun bit for bit the same?),
``launched`` once (through the launch queue under ``horovodrun -np 1``, as the sweep ran the
study), and, with ``--code PATH``, ``in-process`` with another checkout's toolkit (a worktree of
the commit that wrote results.csv) labelled by its commit. Cost: about 1 CPU-minute a way here.

    python experiments/study_reproducibility.py                  # this checkout: 3 runs a cell
    git worktree add /tmp/study-code b6280a5
    python experiments/study_reproducibility.py --code /tmp/study-code   # appended to the CSV

Writes ``experiments/study/reproducibility.csv`` (cell, code, way, final test accuracy,
committed) and prints it. Higher accuracy is better; what matters here is the agreement.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "study" / "reproducibility.csv"
CELLS = [  # (method, global batch): the walk's three that moved, and an SGD control
    ("sgd_noscale", 1024),
    ("lars_sqrt", 32),
    ("lars_sqrt", 1024),
    ("lbsgd_lars", 1024),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, help="another checkout's toolkit, run in-process")
    args = parser.parse_args()
    code = (args.code or HERE.parent).resolve()
    sys.path.insert(0, str(code))
    import pandas as pd

    from toolkit.runs.events import read_events

    try:
        from toolkit.launching import launch, sweep
    except ImportError:  # a checkout from before toolkit.launching
        from toolkit import launch, sweep
    from toolkit.train import train

    commit = subprocess.run(
        ["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    committed = pd.read_csv(HERE / "study" / "results.csv").query("seed == 0")
    grid = sweep.load(code / "experiments" / "study" / "study.yaml")
    rows = []
    for cell in grid.cells:
        key = (cell.coordinates["method"], cell.coordinates.get("batch.global_size"))
        if key not in CELLS or cell.coordinates["seed"] != 0:
            continue
        ways = ["in-process"] if args.code else ["in-process", "in-process", "launched"]
        for way in ways:
            root = Path(tempfile.mkdtemp(prefix="study-repro-"))
            if way == "launched":
                run = launch.launch(cell.config, runs_root_dir=root)
                while run.status()["state"] in ("queued", "starting", "running"):
                    time.sleep(1)
            else:
                run = train(cell.config, runs_root=root, verbose=0)
            evals = read_events(run.events_path).query("phase == 'eval'")
            was = committed.query("method == @key[0] and global_batch == @key[1]")
            rows.append(
                {
                    "method": key[0],
                    "global_batch": key[1],
                    "code": commit,
                    "way": way,
                    "final_test_accuracy": float(evals["accuracy"].iloc[-1]),
                    "committed": float(was["final_test_accuracy"].iloc[0]),
                }
            )
            print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    if args.code and OUT.exists():
        table = pd.concat([pd.read_csv(OUT), table], ignore_index=True)
    table.to_csv(OUT, index=False)
    print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
