"""The README's pictures, taken from real runs in the headless Chromium the browser tests drive.

    .venv/bin/python experiments/screenshots.py [--out docs/img]      (after ./lab test's set-up)

In a temporary runs root it runs a sweep of the quickstart (global batch 32, 64 and 128, 8
epochs, 2 workers each, through the launch queue; about two minutes on 2 cores), serves the
dashboard with ``streamlit run`` and photographs, in Debian's Chromium through Playwright:

* ``run-detail.png``: Run detail of the batch-64 run (loss, accuracy, rate, samples/s, traffic,
  ``B_simple`` against the batch);
* ``compare.png``: Compare of the three runs;
* ``sweep.png``: the Sweep page on that sweep, its results against the batch;
* ``notebook.png``: JupyterLab running ``notebooks/01_quickstart.ipynb`` at its smoke settings,
  and the live view it draws while it trains;
* ``mlflow-run.png``: the batch-64 run exported (``python -m toolkit export mlflow``) to a real
  ``mlflow server`` (SQLite, in the temporary directory), its loss charts in MLflow's UI.

``--pictures`` takes some of ``dashboard``, ``notebook`` and ``mlflow`` (default: all three).

Each is cut to the top of its page, scaled to 1,000 pixels wide and stored with a 256-colour
palette, so the four weigh a few hundred KB. Run it again after a change to what they show.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from mlflow import MlflowClient
from PIL import Image
from playwright.sync_api import Page, expect, sync_playwright

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_first_page import answers, chromium, dashboard, free_port  # noqa: E402

from toolkit import safe_yaml  # noqa: E402
from toolkit.launching import jupyter  # noqa: E402
from toolkit.runs.rundir import list_runs  # noqa: E402
from toolkit.runs.table import summary  # noqa: E402

BATCHES = (32, 64, 128)
EPOCHS = 8
WIDTH = 1000
VIEWPORT = {"width": 1400, "height": 1100}


@contextlib.contextmanager
def server(command: list[str], ready_url: str, log: Path, env: dict) -> Iterator[None]:
    """``command`` running (its output in ``log``) once ``ready_url`` answers 200; stopped after."""
    with open(log, "wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=out)
        try:
            deadline = time.time() + 120
            while not answers(ready_url):
                if process.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"{command[:4]} did not start: see {log}")
                time.sleep(0.5)
            yield
        finally:
            process.terminate()
            process.wait(timeout=30)


def train(runs: Path, env: dict) -> dict[int, str]:
    """The sweep, run to the end through the CLI; its run ids by global batch."""
    base = safe_yaml.load_file(ROOT / "experiments" / "quickstart.yaml") | {"epochs": EPOCHS}
    sweep = runs.parent / "screens.yaml"
    grid = {"batch.global_size": list(BATCHES)}
    sweep.write_text(json.dumps({"name": "screens", "base": base, "grid": grid}))
    command = [sys.executable, "-m", "toolkit", "--runs", str(runs), "sweep", str(sweep)]
    subprocess.run(command, cwd=ROOT, env=env, check=True)
    return {summary(run)["global_batch"]: run.run_id for run in list_runs(runs)}


def save(page: Page, out: Path, height: int = 1100) -> None:
    """The top ``height`` pixels of the page, scaled to :data:`WIDTH` and palette-coded. The
    window is made that tall (Streamlit scrolls inside the page, so a full-page shot would stop
    at the window), then set back."""
    page.set_viewport_size({"width": VIEWPORT["width"], "height": height})
    page.wait_for_timeout(2000)  # the page lays out again and Plotly finishes its transitions
    shot = out.with_suffix(".full.png")
    page.screenshot(path=shot)
    page.set_viewport_size(VIEWPORT)
    image = Image.open(shot).convert("RGB")
    image = image.resize((WIDTH, round(image.height * WIDTH / image.width)), Image.LANCZOS)
    image.quantize(256).save(out, optimize=True)
    shot.unlink()
    print(f"{out}: {out.stat().st_size / 1e3:.0f} kB")


@contextlib.contextmanager
def browser_page() -> Iterator[Page]:
    """A page in Debian's headless Chromium, as the dashboard's benchmarks open it."""
    with sync_playwright() as playwright:
        browser = chromium(playwright)
        yield browser.new_page(viewport=VIEWPORT)
        browser.close()


def photograph_dashboard(runs: Path, ids: dict[int, str], out: Path) -> None:
    """Run detail, Compare and the Sweep page, served on ``runs``."""
    with dashboard(runs) as (url, _, address):
        with browser_page() as page:
            page.goto(address)  # the owner's address: its cookie opens the pages after it
            page.goto(f"{url}/detail?run={ids[64]}")
            expect(page.get_by_text("Per-layer trust ratio")).to_be_visible(timeout=120_000)
            save(page, out / "run-detail.png", height=1900)

            page.goto(f"{url}/compare?" + "&".join(f"run={ids[b]}" for b in BATCHES))
            expect(page.locator(".js-plotly-plot")).to_have_count(3, timeout=60_000)
            save(page, out / "compare.png")

            page.goto(f"{url}/sweep")
            page.get_by_text("A sweep run here").click()
            expect(page.locator(".js-plotly-plot").first).to_be_visible(timeout=60_000)
            page.get_by_text("Metric").first.scroll_into_view_if_needed()
            save(page, out / "sweep.png", height=1350)


def photograph_mlflow(runs: Path, run_id: str, out: Path, work: Path, env: dict) -> None:
    """MLflow's UI on ``run_id``, exported to a server started here: its loss charts."""
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    store = work / "mlflow"
    command = [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--workers", "1", "--artifacts-destination", str(store)]
    command += ["--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}"]
    with server(command, f"{uri}/health", work / "mlflow.log", env):
        export = [sys.executable, "-m", "toolkit", "--runs", str(runs), "export", "mlflow"]
        where = ["--tracking-uri", uri, "--experiment", "quickstart"]
        subprocess.run([*export, run_id, *where], cwd=ROOT, env=env, check=True)
        client = MlflowClient(uri)
        (found,) = client.search_runs(
            [client.get_experiment_by_name("quickstart").experiment_id],
            f"tags.`lab.run_id` = '{run_id}'",
        )
        page_url = f"{uri}/#/experiments/{found.info.experiment_id}/runs/{found.info.run_id}"
        with browser_page() as page:
            page.goto(f"{page_url}/model-metrics")
            page.get_by_text("Model training", exact=True).click()  # not the GenAI view
            page.goto(f"{page_url}/model-metrics")
            page.reload()  # the same address: drawn again in the training view
            page.locator("button[aria-label=Close]").click()  # the assistant's panel
            page.get_by_placeholder("Search metric charts").fill("loss")
            expect(page.get_by_text("train_loss").first).to_be_visible(timeout=60_000)
            save(page, out / "mlflow-run.png", height=1000)


def notebook(env: dict, out: Path, work: Path) -> None:
    """JupyterLab as ``./lab notebook`` starts it, running the quickstart notebook."""
    notebooks = work / "notebooks"
    shutil.copytree(jupyter.NOTEBOOKS, notebooks)
    jupyter.install_kernel()
    settings = work / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)  # no "Would you like to get notified..." over the picture
    news = {"fetchNews": "false", "checkForUpdates": False}
    (settings / "notification.jupyterlab-settings").write_text(json.dumps(news))
    token, port = secrets.token_hex(16), free_port()
    command, lab_env = jupyter.server(
        [f"--port={port}", "--no-browser", "--ServerApp.port_retries=0"],
        root_dir=notebooks,
        token=token,
    )
    lab_env.update(
        PATH=env["PATH"],
        LBL_NOTEBOOK_SMOKE="1",
        LBL_RUNS=str(work / "notebook-runs"),
        **jupyter.private_dirs(work),
    )
    url = f"http://127.0.0.1:{port}"
    with server(command, f"{url}/api/status?token={token}", work / "jupyterlab.log", lab_env):
        with browser_page() as page:
            page.goto(f"{url}/lab/tree/01_quickstart.ipynb?token={token}")
            kernel = page.locator(".jp-NotebookPanel-toolbar .jp-Toolbar-kernelName")
            kernel.filter(has_text=jupyter.KERNEL_DISPLAY_NAME).wait_for(timeout=90_000)
            page.wait_for_timeout(5000)  # the kernel starts
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator('li[data-command="runmenu:run-all"]').click()
            live = page.locator(".jp-Cell:has(progress) .js-plotly-plot").first  # under its line
            live.locator(".main-svg").first.wait_for(timeout=300_000)
            live.scroll_into_view_if_needed()
            page.wait_for_timeout(20_000)  # let the live view grow for a while
            live.scroll_into_view_if_needed()
            box = live.bounding_box()
            page.mouse.wheel(0, box["y"] - 150)  # the cell above it in view too
            save(page, out / "notebook.png")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "img"))
    pictures = ("dashboard", "notebook", "mlflow")
    parser.add_argument("--pictures", nargs="+", choices=pictures, default=pictures)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lbl-screens-") as tmp:
        work = Path(tmp)
        runs = work / "runs"
        env = dict(os.environ, LBL_RUNS=str(runs), TF_CPP_MIN_LOG_LEVEL="2")
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        ids = train(runs, env) if {"dashboard", "mlflow"} & set(args.pictures) else {}
        if "dashboard" in args.pictures:
            photograph_dashboard(runs, ids, out)
        if "mlflow" in args.pictures:
            photograph_mlflow(runs, ids[64], out, work, env)
        if "notebook" in args.pictures:
            notebook(env, out, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
