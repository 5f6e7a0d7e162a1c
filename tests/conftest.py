"""Shared test set-up: quiet TensorFlow, the repository root, a Python that has the toolkit."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def subprocess_env():
    """Environment for child processes: this interpreter's bin first on PATH (horovodrun)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


def run_cli(args: list[str], runs, env: dict | None = None, timeout: float = 300):
    """``python -m toolkit --runs RUNS ARGS`` from the repository root, finished."""
    import subprocess

    return subprocess.run(
        [sys.executable, "-m", "toolkit", "--runs", str(runs), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
