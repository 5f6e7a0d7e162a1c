"""How long the dashboard's Compare page takes with 20 runs of 10,000 events each.

    .venv/bin/python experiments/bench_compare_page.py [--runs 20] [--events 10000] [--repeat 5]

Fabricates the runs in a temporary directory (app/fabricate.py), then renders the Compare page
with all of them selected through Streamlit's AppTest (the page script end to end: reading,
figures, tables, serialising the charts) and prints a small table:

* cold: the first render, every cache empty (each events file parsed);
* warm: later renders, files unchanged (the usual case while browsing);
* control changed: a rerun after moving the smoothing slider (figures rebuilt, files cached);
* figures only: building the page's Plotly figures from the loaded frames, without Streamlit;
* read_events: parsing the files with ``toolkit.events.read_events``, the bulk of "cold".

One-time imports (TensorFlow, via the toolkit's config validation) are done before timing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from app import charts, data
    from app.charts import Series
    from app.fabricate import fake_run
    from toolkit.events import read_events

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["LBL_RUNS"] = tmp
        started = time.perf_counter()
        ids = [f"bench-{i:02d}" for i in range(args.runs)]
        for i, run_id in enumerate(ids):
            fake_run(
                tmp,
                run_id,
                events=args.events,
                seed=i,
                optimizer=("lars", "sgd")[i % 2],
            )
        lines = (Path(tmp) / ids[0] / "events.jsonl").read_bytes().count(b"\n")
        print(
            f"fabricated {args.runs} runs x {lines} events in {time.perf_counter() - started:.1f} s"
        )

        at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
        at.run()  # imports (TensorFlow through the toolkit) and the Runs page
        at.switch_page("views/compare.py")
        at.session_state["compare_runs"] = ids

        def render() -> float:
            begin = time.perf_counter()
            at.run()
            elapsed = time.perf_counter() - begin
            assert not at.exception, at.exception
            assert len(at.get("plotly_chart")) == 3, "expected 3 charts"
            assert at.multiselect[0].value == ids
            return elapsed

        st.cache_data.clear()
        cold = render()
        warm = [render() for _ in range(args.repeat)]
        slider = at.slider[0]
        changed = []
        for i in range(args.repeat):
            at.slider[0].set_value(0.5 + 0.05 * (i % 8))
            changed.append(render())
        assert slider.label == "EMA smoothing"

        begin = time.perf_counter()
        for run in data.runs():
            read_events(run.events_path)
        reading = time.perf_counter() - begin

        frames = {r.run_id: data.events(r) for r in data.runs()}
        begin = time.perf_counter()
        for metric, phase in (
            ("loss", "train"),
            ("loss", "eval"),
            ("accuracy", "eval"),
        ):
            series = [
                Series(run_id, rows["step"], rows[metric])
                for run_id, frame in frames.items()
                for rows in [data.phase(frame, phase)]
            ]
            charts.lines(series, metric, smoothing=0.6).to_json()
        figures = time.perf_counter() - begin

    print(f"\nCompare page, {args.runs} runs x {lines} events, 3 metric charts (AppTest)")
    print(f"{'case':<28}{'seconds':>10}")
    print(f"{'cold (caches empty)':<28}{cold:>10.3f}")
    print(f"{f'warm (median of {args.repeat})':<28}{statistics.median(warm):>10.3f}")
    print(f"{'control changed (median)':<28}{statistics.median(changed):>10.3f}")
    print(f"{'figures only (build + JSON)':<28}{figures:>10.3f}")
    print(f"{'read_events of all files':<28}{reading:>10.3f}  (toolkit parser, cold part)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
