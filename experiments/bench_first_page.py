"""How long a freshly started dashboard takes to answer and to draw its first page.

    .venv/bin/python experiments/bench_first_page.py [--runs 10] [--repeat 5]

Fabricates ``--runs`` finished runs (tests/fabricate.py) in a temporary runs root, then, for each
repeat, starts a new ``streamlit run app/server.py`` server as ``./lab start`` does (a new
process: nothing imported, nothing cached) and opens it in Debian's headless Chromium
(Playwright). Prints, per repeat and as the median with the spread:

* server up: from starting the process to the first answer of its health endpoint;
* first page: from the browser's request of the printed address (the token, answered by the
  cookie and a redirect) to the Runs table drawn (its data grid visible);
* total: the two together, what a user waits for after ``./lab start`` has set up;
* launch page: ``--reading`` seconds after the first page (a user reading the runs table),
  from asking for the Launch page to its form drawn (the schedule preview's chart visible).

Each repeat measures the dashboard twice, in turn: ``served=lab``, as ``./lab start`` serves
it (``app/server.py``: the pages behind the owner's token, opened at the printed address), and
``served=plain``, the peer: Streamlit's own server on ``app/main.py`` with the token off
(``LBL_DASHBOARD_OPEN=1``), the dashboard as it was served before the token. The table gives
each and their ratio. Every repeat goes to ``experiments/bench_first_page_served.csv``
(:mod:`benchmark_csv`; ``bench_first_page.csv`` holds the rows of the Launch page's warm-up,
measured before the token).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # fabricate.py: the tests' synthetic runs

import benchmark_csv  # noqa: E402

CHROMIUM = "/usr/bin/chromium"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


SERVED = {
    "lab": ("app/server.py", {}),
    "plain": ("app/main.py", {"LBL_DASHBOARD_OPEN": "1"}),
}
"""How the dashboard is served: its script and environment (see the module's docstring)."""


@contextmanager
def dashboard(root: Path, served: str = "lab") -> Iterator[tuple[str, float, str]]:
    """A new dashboard on ``root``, served as :data:`SERVED` says: its URL, the seconds from
    starting the process to the first answer of its health endpoint, and the address to open
    (with the token, of a folder of this benchmark's own, ``$LBL_CONFIG``). Stopped on exit."""
    from app import access

    os.environ.setdefault(access.CONFIG_ENV, tempfile.mkdtemp(prefix="lbl-bench-config-"))
    script, changes = SERVED[served]
    port = free_port()
    env = {**os.environ, "LBL_RUNS": str(root), **changes}
    command = [sys.executable, "-m", "streamlit", "run", str(ROOT / script)]
    command += ["--server.address", "127.0.0.1", f"--server.port={port}", "--server.headless=true"]
    started = time.perf_counter()
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        while not answers(f"http://127.0.0.1:{port}/_stcore/health"):
            if server.poll() is not None or time.perf_counter() - started > 120:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        url = f"http://127.0.0.1:{port}"
        address = url + "/" if changes else access.url("127.0.0.1", port)
        yield url, time.perf_counter() - started, address
    finally:
        server.terminate()
        server.wait(timeout=30)


def chromium(playwright):
    """Debian's headless Chromium, never a downloaded browser."""
    return playwright.chromium.launch(
        executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
    )


def one_start(root: Path, playwright, reading_s: float, served: str) -> tuple[float, float, float]:
    """(server up, first page, launch page) in seconds, for one fresh server."""
    with dashboard(root, served) as (url, up, address):
        browser = chromium(playwright)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        asked = time.perf_counter()
        page.goto(address)  # the printed address: the token, answered by a cookie and a redirect
        page.locator("[data-testid='stDataFrame']").first.wait_for(timeout=120_000)
        drawn = time.perf_counter() - asked
        time.sleep(reading_s)
        asked = time.perf_counter()
        page.goto(f"{url}/launch")
        page.locator(".js-plotly-plot").first.wait_for(timeout=120_000)
        launch = time.perf_counter() - asked
        browser.close()
        return up, drawn, launch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--reading", type=float, default=5.0, help="seconds on the first page")
    args = parser.parse_args()

    from fabricate import fake_run
    from playwright.sync_api import sync_playwright

    root = Path(tempfile.mkdtemp(prefix="lbl-first-page-"))
    for i in range(args.runs):
        fake_run(root, f"run-{i:03d}", events=2000)
    rows = []
    with sync_playwright() as playwright:
        for repeat in range(1, args.repeat + 1):
            for served in SERVED:
                up, drawn, launch = one_start(root, playwright, args.reading, served)
                rows.append(
                    {"repeat": repeat, "served": served, "runs": args.runs, "server_up_s": up}
                    | {"first_page_s": drawn, "total_s": up + drawn, "reading_s": args.reading}
                    | {"launch_page_s": launch}
                )
                print(
                    f"repeat {repeat} ({served}): server up {up:.2f} s, first page {drawn:.2f} s, "
                    f"launch page {launch:.2f} s"
                )
    benchmark_csv.save(__file__, rows, variant="served")
    table = pd.DataFrame(rows)
    print(f"\n{args.runs} runs, {args.repeat} fresh servers each way (median, min-max)")
    print("| measure | ./lab start (s) | plain Streamlit (s) | ratio |\n| --- | --- | --- | --- |")
    for name in ("server_up_s", "first_page_s", "total_s", "launch_page_s"):
        lab, plain = (table[table.served == served][name] for served in ("lab", "plain"))
        shown = [f"{t.median():.2f} ({t.min():.2f}-{t.max():.2f})" for t in (lab, plain)]
        ratio = lab.median() / plain.median()
        print(f"| {name[:-2].replace('_', ' ')} | {' | '.join(shown)} | {ratio:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
