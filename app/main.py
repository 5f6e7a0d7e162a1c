"""Large-Batch Lab dashboard's pages. From the repository root: ``streamlit run app/server.py``
(:mod:`app.server`: these pages behind the owner's token).

Pages (app/views/, not pages/, so Streamlit's automatic pages/ navigation never takes over):
Runs, Launch, Run detail, Compare, Sweep, Search.

A session that did not show the token (:mod:`app.access`) gets one line saying whose dashboard
this is, and nothing read from the runs root. The app only reads run directories under the runs
root (``$LBL_RUNS``, default ``./runs``), and acts on them through :mod:`app.actions`.
"""

import importlib
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Streamlit puts app/ on the path; the app imports `app.*` and `toolkit`.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from app import access, data  # noqa: E402
from toolkit.runs import theme  # noqa: E402

st.set_page_config(page_title="Large-Batch Lab", page_icon="📈", layout="wide")
theme.use()  # the notebooks' look: every chart is drawn with theme=None
if not access.admitted():
    st.title("Large-Batch Lab")
    st.info(access.refusal())
    st.stop()
RUNS = st.Page("views/runs.py", title="Runs", icon=":material/table_rows:")


def home() -> None:
    """The app's root shows the Runs page at its own address, ``/runs``, so that both work (a
    default page is served at ``/`` only)."""
    st.switch_page(RUNS)


page = st.navigation(
    [
        st.Page(home, title="Large-Batch Lab", default=True, visibility="hidden"),
        RUNS,
        st.Page("views/launch.py", title="Launch", icon=":material/rocket_launch:"),
        st.Page("views/detail.py", title="Run detail", icon=":material/monitoring:"),
        st.Page("views/compare.py", title="Compare", icon=":material/stacked_line_chart:"),
        st.Page("views/sweep.py", title="Sweep", icon=":material/grid_on:"),
        st.Page("views/search.py", title="Search", icon=":material/travel_explore:"),
    ]
)
with st.sidebar:
    st.text("Runs root")
    st.code(str(data.root().resolve()), language=None, wrap_lines=True)


# How long the first page has to reach the browser before the Launch form's modules load: an
# import holds the interpreter's lock, and the server sends the page under the same lock. (A
# comment, not a docstring: Streamlit draws a main script's bare strings on the page.)
WARM_AFTER_S = 2.0


def _import_the_launch_form() -> None:
    time.sleep(WARM_AFTER_S)
    importlib.import_module("app.form")


@st.cache_resource(show_spinner=False)
def warm_the_launch_form() -> threading.Thread:
    """Import the Launch form's modules (Keras and TensorFlow: ~4 s on 2 cores) in the
    background, once per server, ``WARM_AFTER_S`` after the first page: its first visit
    then finds them loaded (a visit meanwhile waits on Python's import lock for the rest, never
    imports twice)."""
    loading = threading.Thread(target=_import_the_launch_form, daemon=True)
    loading.start()
    return loading


page.run()
warm_the_launch_form()
