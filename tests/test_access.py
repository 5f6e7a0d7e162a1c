"""The dashboard is its owner's (app/access.py, app/server.py, app/actions.py): the token's file,
its constant-time comparison, every page and action refused without it (AppTest), and the
server as ``./lab start`` runs it: what a request without the token gets, over HTTP and the
websocket, what another Unix user's headless Chromium sees, and the owner stopping a run."""

from __future__ import annotations

import contextlib
import hmac
import os
import pwd
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import CHROMIUM, ROOT, dashboard, dashboard_server, free_port, headless_chromium
from fabricate import fake_run
from playwright.sync_api import expect, sync_playwright
from streamlit.testing.v1 import AppTest

from app import access
from toolkit.runs import processes

PAGES = [None, "runs", "launch", "detail", "compare", "sweep", "search"]
"""The main script alone, then each page of its navigation (app/views/)."""
VISITOR = "lbl-visitor"
"""The second Unix user the browser test creates (and removes)."""


@pytest.fixture
def own_config(tmp_path, monkeypatch) -> Path:
    """A token folder of this test's own (``$LBL_CONFIG``), not yet made."""
    folder = tmp_path / "config" / "large-batch-lab"
    monkeypatch.setenv(access.CONFIG_ENV, str(folder))
    return folder


def test_the_token_is_its_owners_alone_and_the_same_until_replaced(own_config):
    made = access.token()
    path = own_config / "dashboard-token"
    assert access.token_path() == path and path.read_text() == made + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(own_config.stat().st_mode) == 0o700
    assert len(made) >= 40 and access.token() == made  # 32 random bytes, kept across restarts
    result = subprocess.run(
        [sys.executable, "-m", "app.access", "--new-token"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0 and str(path) in result.stdout, result.stderr
    assert access.token() != made and not access.matches(made)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)  # another user could have read it: it is no longer the owner's alone
    with pytest.raises(access.TokenFileError, match=f"{path}.*0644.*--new-token"):
        access.token()


def test_the_token_lives_with_the_users_settings_by_default(monkeypatch, tmp_path):
    monkeypatch.delenv(access.CONFIG_ENV)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert access.token_path() == tmp_path / "xdg" / "large-batch-lab" / "dashboard-token"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert access.token_path() == tmp_path / "home/.config/large-batch-lab/dashboard-token"


def test_the_token_and_the_cookie_are_compared_in_constant_time(own_config, monkeypatch):
    compared = []
    real = hmac.compare_digest
    monkeypatch.setattr(
        access.hmac, "compare_digest", lambda a, b: compared.append((a, b)) or real(a, b)
    )
    token, cookie = access.token(), access.cookie_value()
    assert cookie != token and token not in cookie  # the cookie never holds the token
    assert access.matches(token) and not access.matches(token[:-1] + "x")
    assert access.cookie_matches(cookie) and not access.cookie_matches(token)
    assert compared == [
        (token.encode(), token.encode()),
        ((token[:-1] + "x").encode(), token.encode()),
        (cookie.encode(), cookie.encode()),
        (token.encode(), cookie.encode()),
    ]
    assert not access.matches(None) and not access.matches("") and not access.cookie_matches(None)


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory) -> Path:
    """Two runs whose ids, and the root's own path, appear nowhere a visitor looks."""
    root = tmp_path_factory.mktemp("owners-runs")
    fake_run(root, "secret-lars", events=200)
    fake_run(root, "secret-sgd", events=200, optimizer="sgd", state="failed", seed=1)
    return root


def everything_drawn(at: AppTest) -> str:
    """Every element the script drew, main area and sidebar, as the text of its message."""

    def walk(node) -> list[str]:
        children = getattr(node, "children", {})
        return [str(getattr(node, "proto", ""))] + [t for c in children.values() for t in walk(c)]

    return "\n".join(walk(at.main) + walk(at.sidebar))


@pytest.mark.parametrize("name", PAGES)
def test_without_the_token_a_page_draws_one_line_and_nothing_of_the_runs(
    name, runs_root, monkeypatch
):
    """Every page, as a visitor's session opens it (no token, no cookie), then as the owner's
    (the token in the address, as AppTest's query string), which sees the runs root."""
    monkeypatch.setenv("LBL_RUNS", str(runs_root))
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=60)
    if name:
        at.switch_page(f"views/{name}.py")
    at.query_params["token"] = "a-guess"
    at.run()
    drawn = everything_drawn(at)
    assert not at.exception and [i.value for i in at.info] == [access.refusal()]
    assert "secret-" not in drawn and str(runs_root) not in drawn
    assert not at.button and not at.selectbox and not at.dataframe and not at.text_input
    owners = dashboard()
    if name:
        owners.switch_page(f"views/{name}.py")
    owners.run()
    drawn = everything_drawn(owners)
    assert not owners.exception and access.refusal() not in drawn
    assert str(runs_root.resolve()) in drawn  # the sidebar names the runs root
    if name in (None, "runs", "detail", "compare"):
        assert "secret-lars" in drawn
    assert "token" not in owners.query_params  # taken out of the address once read


def act_on(root: str, run_id: str, token: str | None) -> None:
    """An AppTest script: delete run ``run_id`` through the dashboard's one door for actions."""
    import streamlit as st

    from app.actions import act
    from toolkit.launching import launch as launcher

    if token:
        st.query_params["token"] = token
    act(lambda: launcher.delete(run_id, root))
    st.success("deleted")


def test_an_action_without_the_token_does_nothing(tmp_path):
    """The delete action's own code path, driven without a page or a button: refused, the run
    left whole; with the token, done."""
    run = fake_run(tmp_path, "kept", events=50)
    at = AppTest.from_function(
        act_on, args=(str(tmp_path), run.run_id, None), default_timeout=30
    ).run()
    assert [e.value for e in at.error] == [access.refusal()] and not at.success
    assert run.path.is_dir() and run.config_path.exists()
    at = AppTest.from_function(
        act_on, args=(str(tmp_path), run.run_id, access.token()), default_timeout=30
    )
    at.run()
    assert not at.error, at.error[0].value
    assert [s.value for s in at.success] == ["deleted"]
    assert not run.path.exists()


def get(url: str, cookie: str | None = None) -> tuple[int, dict, str]:
    """``GET url`` without following redirects: its status, headers and body."""

    class Stay(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    request = urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {})
    try:
        with urllib.request.build_opener(Stay).open(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as answer:
        return answer.code, dict(answer.headers), answer.read().decode()


@pytest.fixture(scope="module")
def server(runs_root, tmp_path_factory):
    """The dashboard as ``./lab start`` serves it, on the owner's runs root: the address it
    printed, and the log it printed it in."""
    log = tmp_path_factory.mktemp("server") / "streamlit.log"
    with dashboard_server(runs_root, log) as address:
        yield address, log


def test_the_server_prints_the_owners_address_and_answers_only_it(server, runs_root):
    """About 5 s (the server's start). Without the token, every address gets one short page
    (403) naming the owner and nothing of the runs; the token is answered with the cookie and
    a redirect to the same address without it; the cookie opens the page."""
    address, log = server
    base = address.split("/?")[0]
    assert address == f"{base}/?token={access.token()}"
    assert str(access.token_path()) in log.read_text()
    for path in (
        "/",
        "/runs",
        "/detail?run=secret-lars",
        "/?token=a-guess",
        "/_stcore/host-config",
    ):
        status, _, body = get(base + path)
        assert status == 403 and access.owner() in body and "belongs to" in body, path
        assert "secret-" not in body and str(runs_root) not in body, path
    assert get(base + "/_stcore/health")[::2] == (200, "ok")
    status, headers, _ = get(f"{base}/detail?run=secret-lars&token={access.token()}")
    assert status == 303 and headers["location"] == "/detail?run=secret-lars"
    cookie = headers["set-cookie"]
    assert f"{access.COOKIE}={access.cookie_value()};" in cookie
    assert "HttpOnly" in cookie and "SameSite=lax" in cookie and access.token() not in cookie
    status, _, body = get(
        f"{base}/detail?run=secret-lars", f"{access.COOKIE}={access.cookie_value()}"
    )
    assert status == 200 and "<html" in body.lower()
    assert get(base + "/", f"{access.COOKIE}={access.token()}")[0] == 403  # the token is no cookie


def test_the_websocket_opens_only_with_the_cookie(server):
    """A page's data all travel on ``/_stcore/stream``: without the cookie, or with a forged
    one, its handshake is refused (403); with it, it opens."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    address, _ = server
    stream = address.split("/?")[0].replace("http", "ws", 1) + "/_stcore/stream"
    origin = {"Origin": address.split("/?")[0]}
    for cookie in (None, f"{access.COOKIE}=forged"):
        headers = origin | ({"Cookie": cookie} if cookie else {})
        with pytest.raises(InvalidStatus) as refused:
            with connect(stream, additional_headers=headers, open_timeout=30):
                pass
        assert refused.value.response.status_code == 403
    headers = origin | {"Cookie": f"{access.COOKIE}={access.cookie_value()}"}
    with connect(stream, additional_headers=headers, open_timeout=30, subprotocols=["streamlit"]):
        pass


def test_without_a_token_the_dashboard_refuses_to_listen_beyond_this_machine(tmp_path):
    """``./lab start --no-token`` with ``--server.address 0.0.0.0``: one line saying why, and no
    server. (About 2 s: Streamlit's start, up to reading its options.)"""
    port = free_port()
    command = [sys.executable, "-m", "streamlit", "run", "app/server.py"]
    command += ["--server.address", "0.0.0.0", "--server.port", str(port)]
    env = {**os.environ, access.OPEN_ENV: "1", "LBL_RUNS": str(tmp_path)}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    (said,) = [line for line in result.stderr.splitlines() if "refused" in line]
    assert "--no-token" in said and "0.0.0.0" in said and "127.0.0.1" in said


@contextlib.contextmanager
def second_user() -> Path:
    """A Unix user other than the owner, ``lbl-visitor``, with a home of its own (removed
    afterwards)."""
    if subprocess.run(["id", VISITOR], capture_output=True).returncode != 0:
        subprocess.run(
            ["useradd", "--system", "--create-home", "--shell", "/usr/sbin/nologin", VISITOR],
            check=True,
        )
    home = Path(pwd.getpwnam(VISITOR).pw_dir)
    try:
        yield home
    finally:
        subprocess.run(["userdel", "--remove", VISITOR], capture_output=True)


@contextlib.contextmanager
def chromium_as(user: str, home: Path):
    """Headless Chromium run as ``user`` (its own profile in ``home``), reached by Playwright
    over the DevTools protocol: every request it makes is that user's."""
    port = free_port()
    command = ["runuser", "-u", user, "--", CHROMIUM, "--headless", "--no-sandbox"]
    command += [f"--remote-debugging-port={port}", f"--user-data-dir={home / 'profile'}"]
    command += ["--enable-unsafe-swiftshader", "about:blank"]
    browser = subprocess.Popen(command, env={"HOME": str(home), "PATH": os.environ["PATH"]})
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        browser.terminate()
        browser.wait(timeout=30)


@pytest.mark.timeout(300)
def test_another_user_sees_nothing_and_the_owner_stops_a_run_in_chromium(server, runs_root):
    """About 25 s. A second Unix user cannot read the token's file, and its Chromium finds at the
    bare address, with a wrong token and at a run's own address, one line and no run id and no
    button; the owner's Chromium opens the printed address, sees the runs, and stops one."""
    address, _ = server
    base = address.split("/?")[0]
    run = fake_run(runs_root, "secret-live", events=100, state="running")
    sleeper = subprocess.Popen(["sleep", "300"])
    run.set_status("running", processes=[processes.record("worker", sleeper.pid)])
    try:
        with second_user() as home, sync_playwright() as playwright:
            denied = subprocess.run(
                ["runuser", "-u", VISITOR, "--", "cat", str(access.token_path())],
                capture_output=True,
                text=True,
            )
            assert denied.returncode != 0 and "Permission denied" in denied.stderr
            with chromium_as(VISITOR, home) as devtools:
                browser = connect_when_up(playwright, devtools)
                page = browser.contexts[0].new_page()
                for path in ("/", "/?token=a-guess", "/detail?run=secret-live", "/runs"):
                    response = page.goto(base + path)
                    text = page.inner_text("body")
                    assert response.status == 403 and "belongs to" in text, path
                    assert "secret-" not in page.content(), path
                    assert page.get_by_role("button").count() == 0, path
                browser.close()
            browser = headless_chromium(playwright)
            page = browser.new_page(viewport={"width": 1400, "height": 1400})
            page.goto(address)
            expect(
                page.get_by_role("gridcell", name="secret-live", include_hidden=True)
            ).to_be_attached(timeout=90_000)
            page.goto(f"{base}/detail?run=secret-live")
            stop = page.get_by_role("button", name="Stop", exact=True)  # not the header's own
            stop.and_(page.get_by_test_id("stBaseButton-secondary")).click(timeout=60_000)
            assert sleeper.wait(timeout=60) is not None
            expect(page.get_by_text("state: stopped")).to_be_visible(timeout=60_000)
            browser.close()
    finally:
        sleeper.kill()
    assert run.status()["state"] == "stopped" and "from the app" in run.status()["reason"]


def connect_when_up(playwright, devtools: str):
    """Playwright connected to the Chromium listening at ``devtools``, once it listens."""
    deadline = time.time() + 60
    while True:
        try:
            return playwright.chromium.connect_over_cdp(devtools)
        except Exception:
            if time.time() > deadline:
                raise
            time.sleep(0.5)


def test_streamlit_runs_with_xsrf_protection_and_no_agent_api(server):
    """About 2 s. The options the lab starts Streamlit with, as Streamlit itself resolves them
    (``streamlit config show`` with ``./lab start``'s flags, from the repository root): XSRF
    protection on, the agent API off, local only; and the running server, asked with the
    owner's cookie, refuses to be driven by an agent (``not_available``)."""
    command = [sys.executable, "-m", "streamlit", "config", "show", "--server.address", "127.0.0.1"]
    shown = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    settings = dict(line.split(" = ", 1) for line in shown.splitlines() if " = " in line)
    assert settings["enableXsrfProtection"] == "true" and settings["enableAgentApi"] == "false"
    assert settings["address"] == '"127.0.0.1"'
    address, _ = server
    request = urllib.request.Request(
        address.split("/?")[0] + "/_stcore/agent/interact",
        data=b"{}",
        headers={"Cookie": f"{access.COOKIE}={access.cookie_value()}"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 403 and b"not_available" in refused.value.read()
