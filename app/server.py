"""The dashboard as ``./lab start`` serves it: ``streamlit run app/server.py``, the pages of
``app/main.py`` behind :class:`OwnerOnly`, which lets in the owner's requests alone
(:mod:`app.access`).

Streamlit runs this file's ``app`` (an ``st.App``) under uvicorn, with the options and
``.streamlit/config.toml`` of any ``streamlit run``. At start it prints the address to open,
token included, and refuses to listen beyond this machine with the token off.
"""

import contextlib
import sys
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `streamlit run app/server.py` puts app/ on the path, not its root
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402
from starlette.requests import HTTPConnection  # noqa: E402
from starlette.responses import HTMLResponse, RedirectResponse  # noqa: E402
from streamlit import cli_util, config  # noqa: E402

from app import access  # noqa: E402

HEALTH = "/_stcore/health"
"""Answered to anyone: it says ``ok`` and nothing else (what a script waiting for the server
polls)."""


class OwnerOnly:
    """ASGI middleware in front of every route, websocket included: a request showing the token
    (``?token=``) is answered with the cookie and sent on to its address without the token; a
    request with the cookie goes through; any other gets a page saying whose dashboard this is
    (HTTP 403), or its websocket's handshake refused (403), and nothing of the runs."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or access.is_open():
            return await self.app(scope, receive, send)
        request = HTTPConnection(scope)
        given = request.query_params.get(access.QUERY)
        if scope["type"] == "http" and access.matches(given):
            return await self.admit(request)(scope, receive, send)
        if access.allows(given, request.cookies.get(access.COOKIE)) or scope["path"] == HEALTH:
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        page = f"<!doctype html><title>Large-Batch Lab</title><p>{access.refusal()}</p>"
        return await HTMLResponse(page, status_code=403)(scope, receive, send)

    @staticmethod
    def admit(request: HTTPConnection) -> RedirectResponse:
        """The owner's first request: the cookie, and the same address without the token."""
        kept = [(k, v) for k, v in request.query_params.multi_items() if k != access.QUERY]
        location = request.url.path + (f"?{urlencode(kept)}" if kept else "")
        response = RedirectResponse(location, status_code=303)
        response.set_cookie(
            access.COOKIE, access.cookie_value(), httponly=True, samesite="lax", path="/"
        )
        return response


def listening_address() -> str:
    """The address the server listens on (Streamlit's ``server.address``; unset: every one)."""
    return config.get_option("server.address") or "0.0.0.0"


def refuse_an_open_dashboard_beyond_this_machine() -> None:
    """Exit, saying why, where the token is off and the server would listen beyond 127.0.0.1."""
    address = listening_address()
    if access.is_open() and address not in access.LOOPBACK:
        sys.exit(
            f"[lab] refused: --no-token with --server.address {address} would let anyone who "
            "reaches this machine use the dashboard; keep the token, or listen on 127.0.0.1 "
            "and reach it through an ssh tunnel"
        )


@contextlib.asynccontextmanager
async def announced(_app):
    """At start, print the address to open, token included (the port as bound, after
    Streamlit's search for a free one), and open it in a browser where there is a screen
    (Streamlit's ``server.headless`` off), as ``streamlit run`` opens its own."""
    opened = access.url(listening_address(), config.get_option("server.port"))
    print(f"[lab] the dashboard: {opened}")
    if access.is_open():
        print("[lab] token off (--no-token): anyone who reaches this address may use it")
    else:
        print(f"[lab] its token is in {access.token_path()}, readable by you alone")
    sys.stdout.flush()
    if not config.get_option("server.headless"):
        cli_util.open_browser(opened)
    yield


refuse_an_open_dashboard_beyond_this_machine()
app = st.App("main.py", middleware=[Middleware(OwnerOnly)], lifespan=announced)
