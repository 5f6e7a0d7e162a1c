"""One look for every figure the lab draws, on the dashboard and in notebooks: a Plotly
template named ``lab`` (white, the lab's colours in order) and the colours runs are drawn in.

The dashboard applies it with :func:`use` and draws its charts with Streamlit's own theme off;
a notebook calls :func:`use` once, and :class:`toolkit.runs.monitor.LiveView` names it on its own
figures. Importing this module registers the template and changes nothing else.
"""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio
from plotly.colors import qualitative

NAME = "lab"
COLORS = qualitative.Plotly + qualitative.D3
"""Curve colours in order; a run keeps one of them on every chart (``app.data.colors``)."""

pio.templates[NAME] = go.layout.Template(
    pio.templates["plotly_white"],
    layout={
        "colorway": COLORS,
        "hovermode": "x",
        # room for the tick labels and titles whatever the figure's own margins
        "xaxis": {"automargin": True},
        "yaxis": {"automargin": True},
    },
)


def use() -> None:
    """Make ``lab`` the template of every figure made from now on in this process."""
    pio.templates.default = NAME
