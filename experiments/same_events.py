"""Do two runs of one config log the same numbers? Every event two run directories logged,
compared value for value, the wall-clock fields aside (times, durations, throughput, the
system samples): how a change that should not touch training (a refactoring) is checked on a
real run, e.g. the quickstart launched from a checkout before the change and from one after.

    python experiments/same_events.py RUN_BEFORE RUN_AFTER [--label NAME]

Prints, per phase, the events and values compared and how many differ, and appends the rows
to ``same_events.csv`` beside this script (exit status 1 if any differs).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from toolkit.runs.events import read_events  # noqa: E402

HERE = Path(__file__).resolve().parent
WALL_CLOCK = ("wall", "time", "samples_per_sec", "seconds", "duration", "elapsed", "_s")
"""Columns whose name is or ends with one of these measure the machine, not training."""


def numbers(run: Path) -> pd.DataFrame:
    events = read_events(run / "events.jsonl")
    events = events[events["phase"] != "system"]
    wall = [c for c in events if any(c == w or c.endswith(w) for w in WALL_CLOCK)]
    return events.drop(columns=wall).reset_index(drop=True)


def compare(before: pd.DataFrame, after: pd.DataFrame) -> list[dict]:
    rows = []
    for phase in sorted(set(before["phase"]) | set(after["phase"])):
        a = before[before["phase"] == phase].dropna(axis=1, how="all").reset_index(drop=True)
        b = after[after["phase"] == phase].dropna(axis=1, how="all").reset_index(drop=True)
        columns = sorted(set(a) | set(b))
        same_shape = len(a) == len(b) and set(a) == set(b)
        differing = 0
        if same_shape:
            for column in columns:
                x, y = a[column].to_numpy(), b[column].to_numpy()
                equal = [
                    (pd.isna(p) and pd.isna(q)) or p == q
                    if not isinstance(p, np.ndarray)
                    else np.array_equal(p, q)
                    for p, q in zip(x, y, strict=True)
                ]
                differing += len(equal) - sum(equal)
        rows.append(
            {
                "phase": phase,
                "events": f"{len(a)} / {len(b)}",
                "columns": len(columns),
                "values": len(a) * len(columns) if same_shape else None,
                "differing": differing if same_shape else "shapes differ",
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    rows = compare(numbers(args.before), numbers(args.after))
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    out = HERE / "same_events.csv"
    new = not out.exists()
    with out.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["label", *rows[0]])
        if new:
            writer.writeheader()
        writer.writerows({"label": args.label, **row} for row in rows)
    return 0 if all(row["differing"] == 0 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
