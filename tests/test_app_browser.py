"""End to end in a real browser: the dashboard served by ``streamlit run``, driven by headless
Chromium (Debian's /usr/bin/chromium) through Playwright: launch the quickstart from the Launch
page, follow it until it completes, and see the Compare page draw its charts."""

from __future__ import annotations

import os
import shutil
import socket

import pytest
from conftest import ROOT, dashboard_server, headless_chromium
from playwright.sync_api import expect, sync_playwright

from toolkit import config as config_lib
from toolkit.runs.rundir import RunDir
from toolkit.runs.table import summary


@pytest.fixture
def server(tmp_path):
    """The dashboard as ``./lab start`` serves it (:func:`conftest.dashboard_server`), with an
    empty runs root: its URL, the runs root, and the address it printed, with the token."""
    runs = tmp_path / "runs"
    with dashboard_server(runs, tmp_path / "streamlit.log") as address:
        yield address.split("/?")[0], runs, address


EPOCHS = 6  # the quickstart launched from the form: 62 steps an epoch, above 50% by the 4th


@pytest.mark.timeout(300)
def test_launch_follow_and_compare_in_chromium(server, tmp_path):
    """The quickstart preset (6 of its 20 epochs), launched from the form for real (2 Horovod
    workers on this host), followed live to its end on Run detail, then in the runs table and
    Compare. (The AppTest of the same launch on two cluster hosts is tests/test_multihost.py's.)"""
    url, runs, address = server
    with sync_playwright() as playwright:
        browser = headless_chromium(playwright)
        page = browser.new_page(viewport={"width": 1400, "height": 2400})
        page.goto(address)  # the owner's address: its cookie opens every page after it
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))

        page.goto(f"{url}/launch")
        page.get_by_role("combobox", name="Start from").click(
            timeout=90_000
        )  # first load imports TF
        page.get_by_role("option", name="quickstart", exact=True).click()
        expect(page.get_by_test_id("stMetricValue").first).to_have_text("64", timeout=60_000)
        expect(page.locator(".js-plotly-plot").first).to_be_visible(
            timeout=30_000
        )  # schedule preview
        epochs = page.get_by_label("Epochs", exact=True)  # 6 of the preset's 20: to its end
        epochs.fill(str(EPOCHS))
        epochs.press("Enter")
        total = page.get_by_test_id("stMetric").filter(has_text="Total steps")
        expect(total.get_by_test_id("stMetricValue")).to_have_text(f"{EPOCHS * 62}", timeout=60_000)
        page.get_by_role("button", name="Launch", exact=True).click()
        expect(page.get_by_text("Launched quickstart-")).to_be_visible(timeout=60_000)
        (run_dir,) = runs.iterdir()

        page.get_by_role("link", name="Follow it live").click()
        expect(
            page.get_by_text("state: running").or_(page.get_by_text("state: completed")).first
        ).to_be_visible(timeout=60_000)
        # The live fragment's last tick and the page's rerun at the end can both be on screen for
        # a moment (Streamlit keeps the stale elements until a rerun finishes): wait for the page
        # to settle on exactly one of each, which fails if a duplicate stays.
        expect(page.get_by_text("state: completed")).to_have_count(1, timeout=180_000)
        trust_ratios = page.get_by_text("Per-layer trust ratio")
        expect(trust_ratios).to_have_count(1, timeout=30_000)
        expect(trust_ratios.first).to_be_visible()

        page.get_by_role("link", name="Compare").click()
        expect(page.get_by_role("heading", name="Compare runs")).to_be_visible(timeout=30_000)
        expect(
            page.get_by_text("Runs root")
        ).to_be_visible()  # main.py ran: st.navigation, not pages/ discovery
        expect(page.get_by_role("link", name="Run detail")).to_be_visible()
        charts = page.locator(".js-plotly-plot")
        expect(charts).to_have_count(3, timeout=30_000)
        expect(charts.first.locator(".main-svg").first).to_be_visible()
        expect(charts.first.locator(".legendtext").first).to_have_text(run_dir.name)
        page.wait_for_timeout(1000)  # let the charts paint before the screenshot
        shot = tmp_path / "compare.png"
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    assert shot.stat().st_size > 20_000
    assert (run_dir / "status.json").read_text().count('"completed"') == 1
    assert not errors, errors
    run = RunDir(run_dir)
    quickstart = config_lib.load(ROOT / "experiments" / "quickstart.yaml", [f"epochs={EPOCHS}"])
    assert run.config() == quickstart
    workers = [p["host"] for p in run.status()["processes"] if p["role"] == "worker"]
    assert workers == [socket.gethostname()] * 2
    row = summary(run)
    assert row["state"] == "completed" and row["workers"] == 2 and row["best_eval_accuracy"] > 0.5


def run_colors(page, url: str, run_id: str) -> list[str]:
    """The colours of the traces of ``run_id``'s first chart on Run detail, freshly loaded."""
    page.goto(f"{url}/detail?run={run_id}")
    chart = page.locator(".js-plotly-plot").first
    expect(chart).to_be_visible(timeout=60_000)
    return chart.evaluate("plot => plot.data.map(trace => trace.line && trace.line.color)")


@pytest.mark.timeout(300)
def test_every_page_in_chromium_with_a_live_runs_table_and_screenshots(server, tmp_path):
    """Each page as a browser draws it, from ``/runs`` (an address of its own) to Search, with a
    screenshot of each in ``screenshots/`` for review; the Runs table follows a live run with no
    click, and no page shows an exception or a page-not-found dialog. A run keeps its colour
    across reloads while another is deleted and a new one made."""
    from fabricate import fake_run

    from toolkit.runs.events import EventWriter

    url, runs, address = server
    fake_run(runs, "lars-done", events=400, gns_every=20, system_every=40)
    fake_run(runs, "sgd-failed", events=200, optimizer="sgd", state="failed", seed=1)
    live = fake_run(runs, "live-run", events=100, state="running", pid=os.getpid(), epochs=10)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with sync_playwright() as playwright:
        browser = headless_chromium(playwright)
        page = browser.new_page(viewport={"width": 1400, "height": 2600})  # a page's whole height
        page.goto(address)  # the owner's address: its cookie opens every page after it
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))

        page.goto(f"{url}/runs")
        # the grid is drawn on a canvas; its cells are also in an accessible table
        expect(page.get_by_role("gridcell", name="9.9 of 10", include_hidden=True)).to_be_attached(
            timeout=90_000
        )
        page.screenshot(path=str(shots / "runs.png"), full_page=True)
        with EventWriter(live.events_path) as writer:  # the run goes on; nobody touches the page
            writer.write({"step": 999, "epoch": 9.97, "phase": "train", "loss": 0.1})
        expect(page.get_by_role("gridcell", name="9.97 of 10", include_hidden=True)).to_be_attached(
            timeout=15_000
        )

        for name, heading in (
            ("detail?run=lars-done", "Run detail"),
            ("compare", "Compare runs"),
            ("launch", "Launch a run"),
            ("sweep", "Sweep"),
            ("search", "Search"),
        ):
            page.goto(f"{url}/{name}")
            expect(page.get_by_role("heading", name=heading)).to_be_visible(timeout=90_000)
            if name not in ("sweep", "search"):
                expect(page.locator(".js-plotly-plot").first).to_be_visible(timeout=60_000)
            page.wait_for_timeout(1500)  # let the charts paint
            page.screenshot(path=str(shots / f"{name.split('?')[0]}.png"), full_page=True)
            assert not page.get_by_test_id("stException").count(), name
            assert not page.get_by_text("Page not found").count(), name
        colors = [run_colors(page, url, "live-run")]  # defect 7 of the third walk:
        shutil.rmtree(runs / "lars-done")  # an older run deleted and a new one made,
        fake_run(runs, "newer", events=50, state="failed")
        colors.append(run_colors(page, url, "live-run"))  # then the page reloaded, twice
        colors.append(run_colors(page, url, "live-run"))
        assert colors[0] and colors[0] == colors[1] == colors[2], colors
        assert run_colors(page, url, "newer")[0] != colors[0][0]  # the one made before it's
        browser.close()
    print(f"screenshots for review: {shots}")
    assert sorted(p.name for p in shots.iterdir()) == [
        "compare.png",
        "detail.png",
        "launch.png",
        "runs.png",
        "search.png",
        "sweep.png",
    ]
    assert all(p.stat().st_size > 20_000 for p in shots.iterdir())
    assert not errors, errors
