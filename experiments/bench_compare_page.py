"""How long the dashboard's Compare page takes with 100 runs of 50,000 events each.

    .venv/bin/python experiments/bench_compare_page.py [--runs 100] [--events 50000]
        [--repeat 5] [--root DIR]

Fabricates the runs with the toolkit's own writer (tests/fabricate.py), in ``--root`` if given
(kept, and reused by a later call: fabricating 100 x 50,000 events takes minutes) or else in a
temporary directory. Then renders the Compare page with all of them selected through
Streamlit's AppTest (the page script end to end: reading, figures, table, serialising the
charts) and prints a table:

* first render: every in-process cache empty, as in a new server process (imports aside, which
  ``bench_first_page.py`` measures); the runs' columnar copies (``events.parquet``) are on
  disk, as the writer left them;
* warm: later renders, files unchanged (the usual case while browsing);
* control changed: a rerun after moving the smoothing slider (every chart rebuilt);
* parse without copies: what reading every ``events.jsonl`` from its first byte costs (a run
  directory from before the copies, opened for the first time).

With ``--browser``, also opens the page in Debian's headless Chromium (Playwright), all runs
chosen by its address (``/compare?run=...``), and times from the request to every chart drawn
(each plot holding all its traces): on a new server, and again on a reload.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # fabricate.py: the tests' synthetic runs
sys.path.insert(0, str(ROOT / "experiments"))

import benchmark_csv  # noqa: E402


def fabricate(root: Path, runs: int, events: int) -> list[str]:
    """Run ids of ``runs`` fabricated runs under ``root`` (those already there are kept)."""
    from fabricate import fake_run

    ids = [f"bench-{i:03d}" for i in range(runs)]
    started = time.perf_counter()
    made = 0
    for i, run_id in enumerate(ids):
        if not (root / run_id / "status.json").exists():
            fake_run(root, run_id, events=events, seed=i, optimizer=("lars", "sgd")[i % 2])
            made += 1
    print(f"fabricated {made} of {runs} runs in {time.perf_counter() - started:.1f} s")
    return ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--root", type=Path, help="runs root to fabricate into and reuse")
    parser.add_argument("--browser", action="store_true", help="also time Chromium")
    args = parser.parse_args()

    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from toolkit import files
    from toolkit.runs.events import parse

    root = args.root or Path(tempfile.mkdtemp(prefix="lbl-compare-"))
    root.mkdir(parents=True, exist_ok=True)
    os.environ["LBL_RUNS"] = str(root)
    ids = fabricate(root, args.runs, args.events)
    lines = (root / ids[0] / "events.jsonl").read_bytes().count(b"\n")

    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=300)
    at.run()  # imports and the Runs page
    at.switch_page("views/compare.py")
    at.session_state["compare_runs"] = ids

    def render() -> float:
        begin = time.perf_counter()
        at.run()
        elapsed = time.perf_counter() - begin
        assert not at.exception, at.exception
        assert len(at.get("plotly_chart")) == 3, "expected 3 charts"
        assert at.multiselect[0].value == ids
        assert len(at.dataframe[0].value) == 3 * len(ids)
        return elapsed

    first = []
    for _ in range(args.repeat):
        st.cache_data.clear()
        st.cache_resource.clear()
        first.append(render())
    warm = [render() for _ in range(args.repeat)]
    changed = []
    for i in range(args.repeat):
        at.slider[0].set_value(0.5 + 0.05 * (i % 8))
        changed.append(render())
    assert at.slider[0].label == "EMA smoothing"

    begin = time.perf_counter()
    for run_id in ids:
        parse(files.read_bytes(root / run_id / "events.jsonl"))  # the parser, no copy
    parsing = time.perf_counter() - begin

    def row(name: str, times: list[float]) -> str:
        spread = f"{min(times):.2f}-{max(times):.2f}"
        return f"| {name} | {statistics.median(times):.2f} | {spread} |"

    raw = {
        "first render (new process, copies on disk)": first,
        "warm render": warm,
        "control changed (smoothing)": changed,
        "parse without copies (once)": [parsing],
    }
    print(f"\nCompare page, {len(ids)} runs x {lines} events, 3 charts, AppTest")
    print(f"(median of {args.repeat}, min-max)\n")
    print("| case | seconds | spread |\n| --- | --- | --- |")
    print(row("first render (new process, copies on disk)", first))
    print(row("warm render", warm))
    print(row("control changed (smoothing)", changed))
    print(f"| parse without copies (once) | {parsing:.2f} | |")
    if args.browser:
        new, reload = zip(*(in_chromium(root, ids) for _ in range(args.repeat)), strict=True)
        print(row("Chromium: charts drawn, new server", list(new)))
        print(row("Chromium: charts drawn, reload", list(reload)))
        raw |= {"Chromium: charts drawn, new server": new, "Chromium: charts drawn, reload": reload}
    benchmark_csv.save(
        __file__,
        [
            {"case": case, "repeat": i, "seconds": seconds, "runs": len(ids), "events": lines}
            for case, times in raw.items()
            for i, seconds in enumerate(times, 1)
        ],
    )
    return 0


def in_chromium(root: Path, ids: list[str]) -> tuple[float, float]:
    """Seconds from asking for the Compare page of ``ids`` to its 3 charts drawn, on a new
    server and then on a reload."""
    from bench_first_page import chromium, dashboard
    from playwright.sync_api import sync_playwright

    drawn = (
        "n => { const plots = [...document.querySelectorAll('.js-plotly-plot')];"
        " return plots.length === 3 && plots.every(p => (p._fullData || []).length === n); }"
    )
    query = "&".join(f"run={run_id}" for run_id in ids)
    with dashboard(root) as (url, _, address), sync_playwright() as playwright:
        browser = chromium(playwright)
        page = browser.new_page(viewport={"width": 1400, "height": 1400})
        times = []
        token = address.split("?", 1)[1]  # on the first visit: then its cookie
        for visit in range(2):
            asked = time.perf_counter()
            page.goto(f"{url}/compare?{query}" + ("" if visit else f"&{token}"))
            page.wait_for_function(drawn, arg=2 * len(ids), timeout=120_000)
            times.append(time.perf_counter() - asked)
        browser.close()
    return times[0], times[1]


if __name__ == "__main__":
    sys.exit(main())
