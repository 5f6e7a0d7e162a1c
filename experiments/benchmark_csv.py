"""Where a benchmark keeps its raw numbers: a CSV beside its script, one row per repeat, with the
machine, the commit and the day it ran, so that every figure the README and docs quote from it
can be recomputed (and its spread seen) without running it again."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

import pandas as pd


def machine() -> str:
    """The CPU model and core count this ran on (``/proc/cpuinfo``'s model name on Linux)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        model = next(line.split(":", 1)[1].strip() for line in lines if "model name" in line)
    except (OSError, StopIteration):
        model = platform.processor() or platform.machine()
    return f"{model}, {os.cpu_count()} cores"


def save(script: str, rows: list[dict], variant: str = "") -> Path:
    """Write ``rows`` (one per repeat) to ``<script's name>[_<variant>].csv`` beside
    ``script`` (or in ``$BENCH_CSV_DIR`` where that is set: a smoke test's folder, a GPU
    machine's output), replacing an earlier run's, with the machine, the commit and the date in
    every row; return the path."""
    script = Path(script)
    folder = Path(os.environ.get("BENCH_CSV_DIR") or script.parent)
    path = folder / f"{script.stem}{'_' + variant if variant else ''}.csv"
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=script.parent
    ).stdout.strip()
    frame = pd.DataFrame(rows).assign(
        machine=machine(), commit=commit or None, date=datetime.date.today().isoformat()
    )
    frame.to_csv(path, index=False)
    print(f"raw rows: {path}")
    return path
