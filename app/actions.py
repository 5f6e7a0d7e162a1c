"""What the dashboard does, as opposed to what it shows: launch, stop, resume and delete runs,
tag and note them, export them to MLflow, probe a config, start a sweep, a search or a
calibration. Each goes through :func:`act`, which does it only for the owner's session
(:mod:`app.access`), whichever page, button or request reached it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import streamlit as st

from app import access
from app.data import md_escape
from toolkit.config import ConfigError

T = TypeVar("T")
FAILURES = (ConfigError, ValueError, OSError, RuntimeError)
"""What an action may fail with for a reason the user can read (a bad config, a missing file, a
run that failed): shown as an error, not a traceback."""


def act(action: Callable[[], T], *, doing: str = "Working…", failed: str = "") -> T:
    """``action()``'s result, under a spinner saying ``doing``, for the owner's session; for any
    other, the refusal, and ``action`` is never called. Where ``action`` fails with one of
    :data:`FAILURES`, the error (after ``failed``, e.g. "Nothing was launched: ") is shown and
    the page stops there."""
    access.require()
    try:
        with st.spinner(doing):
            return action()
    except FAILURES as error:
        st.error(md_escape(f"{failed}{error}"))
        st.stop()
