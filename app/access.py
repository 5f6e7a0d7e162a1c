"""Who may use the dashboard: its owner, who holds its token.

On a shared machine 127.0.0.1 is not private: every user of the machine can connect to it. So,
as JupyterLab does, the dashboard asks for a token, a random string kept in
``$LBL_CONFIG/dashboard-token`` (default ``~/.config/large-batch-lab/``), a file only its owner
can read (0600, in a folder only its owner can open, 0700), the same across restarts until
``./lab start --new-token`` replaces it. It is kept with the user's settings, not in the runs
root, because it is the user's key, not the runs': a runs root may be shared with a group or sit
on a shared filesystem.

The address ``./lab start`` prints carries the token (``/?token=...``). The server
(:mod:`app.server`) answers it with a cookie, HttpOnly and SameSite=Lax, that holds an HMAC of
the token, not the token, and sends the browser on to the same address without it; every later
request, page, reload, a run opened in a new tab, and the page's websocket, is let in by that
cookie. Every page's script checks again (:func:`admitted`: the session, the token in the address,
or the cookie the websocket brought), and every action checks once more (:func:`require`), so
nothing is shown or done for a session that did not show the token, whatever the way in.

``./lab start --no-token`` turns all of this off (``LBL_DASHBOARD_OPEN=1``): for a machine no one
else logs in to; then the server refuses to listen beyond this machine.
"""

from __future__ import annotations

import getpass
import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

CONFIG_ENV = "LBL_CONFIG"
"""Environment variable overriding the folder of the lab's settings (the token's file)."""
OPEN_ENV = "LBL_DASHBOARD_OPEN"
"""Set to ``1`` (``./lab start --no-token``), anyone who reaches the dashboard may use it."""
QUERY = "token"
"""The address's parameter that carries the token."""
COOKIE = "lbl_dashboard"
"""The cookie that carries :func:`cookie_value` once the token was shown."""
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
"""Addresses only this machine's users reach."""


class TokenFileError(RuntimeError):
    """The token's file exists but others may read it, or it cannot be read."""


def token_path() -> Path:
    """``$LBL_CONFIG/dashboard-token``, default ``$XDG_CONFIG_HOME`` (else ``~/.config``)
    ``/large-batch-lab/dashboard-token``."""
    folder = os.environ.get(CONFIG_ENV)
    if not folder:
        base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
        folder = Path(base) / "large-batch-lab"
    return Path(folder).expanduser() / "dashboard-token"


def token() -> str:
    """The owner's token: read from :func:`token_path`, made there (mode 0600) if absent.

    Raises :class:`TokenFileError` where the file is readable by anyone but its owner: a token
    others could read is no longer the owner's (``./lab start --new-token`` makes another)."""
    path = token_path()
    if not path.exists():
        return new_token()
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise TokenFileError(
            f"{path} is readable by others (mode {mode:04o}): the dashboard's token is no longer "
            "yours alone; ./lab start --new-token replaces it"
        )
    return path.read_text().strip()


def new_token() -> str:
    """A new random token (32 bytes, URL-safe) in :func:`token_path`, replacing any other;
    created 0600 in a folder made 0700, so it is never readable by others, even for a moment."""
    path = token_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    value = secrets.token_urlsafe(32)
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(value + "\n")
    return value


def is_open() -> bool:
    """Whether the owner turned the token off (``LBL_DASHBOARD_OPEN=1``)."""
    return os.environ.get(OPEN_ENV) == "1"


def matches(given: str | None) -> bool:
    """Whether ``given`` is the token, compared in constant time (:func:`hmac.compare_digest`):
    how long the answer takes says nothing of how much of a guess was right."""
    return isinstance(given, str) and hmac.compare_digest(given.encode(), token().encode())


def cookie_value() -> str:
    """What the cookie holds: an HMAC-SHA256 of a fixed label keyed by the token, so the token
    itself never sits in the browser's cookie store."""
    return hmac.new(token().encode(), b"large-batch-lab dashboard", hashlib.sha256).hexdigest()


def cookie_matches(given: str | None) -> bool:
    """Whether ``given`` is :func:`cookie_value`, compared in constant time."""
    return isinstance(given, str) and hmac.compare_digest(given.encode(), cookie_value().encode())


def allows(token_given: str | None, cookie_given: str | None) -> bool:
    """Whether a request that shows ``token_given`` in its address and ``cookie_given`` in its
    cookie is the owner's: the token off, or either one right."""
    return is_open() or matches(token_given) or cookie_matches(cookie_given)


def owner() -> str:
    """The user the dashboard belongs to: the one running it."""
    return getpass.getuser()


def refusal() -> str:
    """What a visitor without the token reads, and nothing else."""
    return (
        f"This dashboard belongs to {owner()}. Open the address `./lab start` printed "
        "(it carries the token)."
    )


def url(address: str, port: int) -> str:
    """The address to open: ``http://ADDRESS:PORT/?token=TOKEN`` (this machine's name where the
    server listens on every interface); without the token where it is off."""
    host = address if address not in {"", "0.0.0.0", "::"} else os.uname().nodename
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/" + ("" if is_open() else f"?{QUERY}={token()}")


# --- a Streamlit session --------------------------------------------------------------------

ADMITTED = "lbl_admitted"
"""The session-state key set once a session showed the token."""


def admitted() -> bool:
    """Whether this Streamlit session is the owner's: admitted before, or showing the token in
    its address (which is then taken out of it) or the cookie in its websocket's request."""
    import streamlit as st

    if st.session_state.get(ADMITTED):
        return True
    given = st.query_params.get(QUERY)
    if given is not None:
        del st.query_params[QUERY]  # not left in the address bar, its history or a Referer
    if allows(given, st.context.cookies.get(COOKIE)):
        st.session_state[ADMITTED] = True
        return True
    return False


def require() -> None:
    """Go on only for an admitted session: otherwise show :func:`refusal` and stop the script,
    so an action reached without the token does nothing."""
    import streamlit as st

    if not admitted():
        st.error(refusal())
        st.stop()


def main(argv: list[str] | None = None) -> None:
    """``python -m app.access --new-token``: replace the token (what ``./lab start
    --new-token`` runs); without arguments, print the token's file."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m app.access", description=main.__doc__)
    parser.add_argument("--new-token", action="store_true", help="replace the token")
    args = parser.parse_args(argv)
    if args.new_token:
        new_token()
        print(f"[lab] a new token in {token_path()}: the addresses printed before no longer open")
    else:
        print(token_path())


if __name__ == "__main__":
    main()
