"""How many toolkit modules ``launch(config)`` passes through in the launching process, traced
with ``sys.setprofile``: the modules whose functions it calls, the calls that cross from one
module into another, and the modules it comes back into after leaving them. A real launch of
the quickstart (one epoch) in a temporary runs root, stopped as soon as it has started; what
the supervisor and the workers do afterwards is their own processes'.

    python experiments/trace_launch.py [--source DIR] [--label NAME]

``--source``: a checkout of another commit to trace instead (its ``toolkit`` is imported), for
a before/after comparison; the row is appended to ``trace_launch.csv`` beside this script.
"""

from __future__ import annotations

import argparse
import collections
import csv
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def trace(source: Path) -> dict:
    sys.path.insert(0, str(source))
    root = str(source / "toolkit")
    from toolkit.launching import launch as launcher

    def module_of(code) -> str | None:
        path = code.co_filename
        if not path.startswith(root):
            return None
        return str(Path(path).relative_to(source).with_suffix("")).replace("/", ".")

    calls: list[tuple[str | None, str]] = []

    def profile(frame, event, _):
        if event != "call":
            return
        callee = module_of(frame.f_code)
        if callee is None:
            return
        caller = None
        outer = frame.f_back
        while outer is not None and (caller := module_of(outer.f_code)) is None:
            outer = outer.f_back
        calls.append((caller, callee))

    with tempfile.TemporaryDirectory() as runs:
        config = str(source / "experiments" / "quickstart.yaml")
        started = time.perf_counter()
        sys.setprofile(profile)
        try:
            run = launcher.launch(config, overrides=["epochs=1"], runs_root_dir=runs)
        finally:
            sys.setprofile(None)
        seconds = time.perf_counter() - started
        launcher.stop(run, runs, by="trace_launch")
    crossings = [(a, b) for a, b in calls if a != b]
    entries = collections.Counter(b for _, b in crossings)
    modules = {b for _, b in calls}
    return {
        "modules": len(modules),
        "crossings": len(crossings),
        "reentered": sum(1 for n in entries.values() if n > 1),
        "most_entered": ", ".join(f"{m} {n}" for m, n in entries.most_common(3)),
        "training_modules": len({m for m in modules if m.startswith("toolkit.training")}),
        "seconds": round(seconds, 2),
        "list": sorted(modules),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=HERE.parent)
    parser.add_argument("--label", default="this checkout")
    args = parser.parse_args()
    os.chdir(args.source)
    found = trace(args.source.resolve())
    listed = found.pop("list")
    row = {"label": args.label, **found}
    print(" | ".join(f"{k}: {v}" for k, v in row.items()))
    print("modules:", ", ".join(m.removeprefix("toolkit.") for m in listed))
    out = HERE / "trace_launch.csv"
    new = not out.exists()
    with out.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(row))
        if new:
            writer.writeheader()
        writer.writerow(row)


if __name__ == "__main__":
    main()
