"""The notebook door end to end: JupyterLab started by the code behind ``./lab notebook``
(``toolkit.launching.jupyter.server``) on a free port, over a copy of ``notebooks/``, and driven by
headless Chromium (Debian's /usr/bin/chromium) through Playwright, as a user would: open the
quickstart, run all cells (smoke size), and see its figures drawn, live view included.

The server gets its own Jupyter config, runtime and settings folders, so neither the user's nor
the repository's are read or written; its only settings file turns autosave off.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import nbformat
import psutil
import pytest
from conftest import free_port, headless_chromium, run_cli, serving
from playwright.sync_api import sync_playwright
from test_notebooks import PLOTLY, check_executed, values

from toolkit.launching import jupyter
from toolkit.runs.events import read_events
from toolkit.runs.rundir import RunDir

QUICKSTART = "01_quickstart.ipynb"


def get(url: str, token: str | None = None) -> tuple[int, bytes]:
    """``GET url``, with ``token`` in the Authorization header if given."""
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@dataclass
class Lab:
    url: str
    token: str
    notebooks: Path
    process: subprocess.Popen

    def get(self, path: str, token: str | None = None) -> tuple[int, bytes]:
        return get(self.url + path, token)


@pytest.fixture(scope="module")
def lab(tmp_path_factory, subprocess_env):
    tmp = tmp_path_factory.mktemp("lab")
    notebooks = tmp / "notebooks"
    shutil.copytree(jupyter.NOTEBOOKS, notebooks)
    settings = tmp / "settings" / "@jupyterlab" / "docmanager-extension"
    settings.mkdir(parents=True)
    (settings / "plugin.jupyterlab-settings").write_text(json.dumps({"autosave": False}))
    jupyter.install_kernel()
    token, port = secrets.token_hex(16), free_port()
    command, env = jupyter.server(
        [f"--port={port}", "--no-browser", "--ServerApp.port_retries=0"],
        root_dir=notebooks,
        token=token,
    )
    env.update(
        PATH=subprocess_env["PATH"],
        LBL_NOTEBOOK_SMOKE="1",
        LBL_RUNS=str(tmp / "runs"),
        **jupyter.private_dirs(tmp),
    )
    url = f"http://127.0.0.1:{port}"
    with serving(
        command,
        log_path=tmp / "jupyterlab.log",
        ready=lambda: get(f"{url}/api/status", token)[0] == 200,
        timeout_s=90,
        env=env,
    ) as process:
        yield Lab(url, token, notebooks, process)


def test_the_api_refuses_requests_without_the_token(lab):
    for path in ("/api/status", "/api/contents", "/api/kernels", "/api/sessions"):
        assert lab.get(path)[0] == 403, path
        assert lab.get(path, "not-" + lab.token)[0] == 403, path
        assert lab.get(path, lab.token)[0] == 200, path


def listening_addresses(process: psutil.Process) -> list:
    """The inet addresses ``process`` listens on; none once it has exited (the server starts
    short-lived helpers, and one may end between being listed and being read)."""
    try:
        connections = process.net_connections(kind="inet")
    except psutil.NoSuchProcess:
        return []
    return [c.laddr for c in connections if c.status == psutil.CONN_LISTEN]


def test_the_server_and_its_kernels_listen_on_loopback_only(lab):
    port = int(lab.url.rsplit(":", 1)[1])
    server = psutil.Process(lab.process.pid)
    listening = [
        a for p in [server, *server.children(recursive=True)] for a in listening_addresses(p)
    ]
    assert port in [address.port for address in listening]
    assert {address.ip for address in listening} == {"127.0.0.1"}, listening


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--ip=0.0.0.0"], "--ip=0.0.0.0: the notebook server listens on 127.0.0.1 only"),
        (["--port=8890", "--ServerApp.ip", "192.168.1.5"], "--ServerApp.ip 192.168.1.5:"),
        (["--ServerApp.ip="], "--ServerApp.ip=:"),
        (["--IdentityProvider.token="], "--IdentityProvider.token=: an empty token"),
        (["--no-browser", "--ServerApp.token=''"], "--ServerApp.token='': an empty token"),
        (
            ["--PasswordIdentityProvider.hashed_password", '""'],
            '--PasswordIdentityProvider.hashed_password "": an empty hashed_password',
        ),
    ],
)
def test_unsafe_arguments_are_refused_before_anything_starts(args, named, tmp_path):
    with pytest.raises(jupyter.UnsafeArgument, match=re.escape(named)):
        jupyter.server(args)
    result = run_cli(["notebook", *args], tmp_path / "runs", timeout=60)
    assert result.returncode == 2 and result.stderr.startswith(f"error: {named}"), result.stderr


def test_safe_arguments_pass_through_after_the_rules():
    args = ["--port=8890", "--no-browser", "--ip=localhost", "--IdentityProvider.token=abc"]
    command, env = jupyter.server(args, token="t0ken")
    assert command[-len(args) :] == args
    assert "--ServerApp.ip=127.0.0.1" in command
    assert f"--MappingKernelManager.default_kernel_name={jupyter.KERNEL_NAME}" in command
    assert env["JUPYTER_TOKEN"] == "t0ken" and "t0ken" not in " ".join(command)


@pytest.mark.timeout(420)
def test_the_quickstart_runs_in_jupyterlab_in_chromium(lab, tmp_path):
    outside = []  # requests to anything but the server: there must be none (offline figures)
    with sync_playwright() as playwright:
        browser = headless_chromium(playwright)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("request", lambda r: outside.append(r.url) if leaves(r.url) else None)
        page.goto(f"{lab.url}/lab/tree/{QUICKSTART}?token={lab.token}")
        page.locator(".jp-Notebook").wait_for(timeout=60_000)
        kernel_name = page.locator(".jp-NotebookPanel-toolbar .jp-Toolbar-kernelName")
        kernel_name.filter(has_text=jupyter.KERNEL_DISPLAY_NAME).wait_for(timeout=60_000)
        wait_until_idle(lab, timeout_s=90)

        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator('li[data-command="runmenu:run-all"]').click()
        page.wait_for_function(
            """() => {
                const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
                return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.textContent));
            }""",
            timeout=300_000,
            polling=1000,
        )
        wait_until_idle(lab, timeout_s=60)
        live_view = page.locator(".jp-Cell:has(progress) .js-plotly-plot")  # under its line
        live_view.scroll_into_view_if_needed()
        live_view.locator(".main-svg").first.wait_for(timeout=30_000)
        page.wait_for_timeout(1000)  # let the scrolled-to cells paint
        page.screenshot(path=tmp_path / "jupyterlab-quickstart.png")
        live_panels = live_view.locator(".infolayer .annotation").count()  # a title each
        drawn_to = live_view.evaluate(
            "plot => Math.max(...plot.data[0].x._inputArray ?? plot.data[0].x)"
        )
        figures = page.locator(".js-plotly-plot").count()
        page.keyboard.press("Control+s")
        notebook = wait_for_saved_outputs(lab.notebooks / QUICKSTART, timeout_s=30)
        browser.close()

    errors = [
        output
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if output.output_type == "error"
    ]
    assert not errors, errors[0]["ename"] + ": " + errors[0]["evalue"]
    assert live_panels >= 4  # loss, accuracy, lr, samples/sec at least
    shown = sum(c.source.count("fig.show()") for c in notebook.cells if c.cell_type == "code")
    assert figures == shown + 1, (figures, shown)
    # the run's last train event, drawn on screen and saved as a plain figure (no widget)
    (final,) = [
        o.data[PLOTLY]
        for c in notebook.cells
        for o in c.get("outputs", [])
        if "live_view" in str(o)
    ]
    run = RunDir(lab.notebooks.parent / "runs" / final["layout"]["meta"]["live_view"])
    events = read_events(run.events_path)
    last = events[events.phase == "train"].dropna(subset=["loss"]).step.max()
    assert drawn_to == max(values(final["data"][0]["x"])) == last, (drawn_to, last)
    assert "widgets" not in notebook.metadata
    saved = (lab.notebooks / QUICKSTART).stat().st_size
    assert saved < 2_000_000, f"saved with its outputs: {saved:,} bytes"
    assert not outside, outside
    check_executed(notebook, QUICKSTART, lab.notebooks.parent / "runs")  # as test_notebooks


def leaves(url: str) -> bool:
    """Whether a request for ``url`` goes to another machine (``data:`` and ``blob:`` do not)."""
    parts = urllib.parse.urlsplit(url)
    return parts.scheme in ("http", "https", "ws", "wss") and parts.hostname != "127.0.0.1"


def wait_until_idle(lab: Lab, timeout_s: float) -> None:
    """Until the server's one kernel exists and is idle. An answer that is not the list of
    kernels (an error object, while the kernel's session is being made: seen once in a CI run)
    is asked again."""
    deadline = time.time() + timeout_s
    while True:
        status, body = lab.get("/api/kernels", lab.token)
        kernels = json.loads(body) if status == 200 else None
        listed = isinstance(kernels, list) and kernels
        if listed and all(k["execution_state"] == "idle" for k in kernels):
            return
        assert time.time() < deadline, f"kernel not idle: {status} {body[:500]!r}"
        time.sleep(0.5)


def wait_for_saved_outputs(path: Path, timeout_s: float) -> nbformat.NotebookNode:
    """The notebook as saved, once every code cell in it has run."""
    deadline = time.time() + timeout_s
    while True:
        notebook = nbformat.read(path, as_version=4)
        code = [c for c in notebook.cells if c.cell_type == "code"]
        if all(c.execution_count for c in code):
            return notebook
        assert time.time() < deadline, "the notebook was not saved with its outputs"
        time.sleep(0.5)
