"""Plotly figures for the dashboard: overlaid curves (WebGL, downsampled), the schedule
preview and the per-layer trust-ratio heatmap. Pure functions of DataFrames; no Streamlit."""

from __future__ import annotations

import html
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from toolkit.curves import MAX_POINTS, downsample

COLORS = qualitative.Plotly + qualitative.D3
HOVER = "epoch %{{x:.2f}} (step %{{customdata[0]}})<br>{name} %{{y:.4g}}<extra></extra>"


@dataclass
class Series:
    """One curve: a name and aligned x/y arrays."""

    name: str
    x: np.ndarray | pd.Series
    y: np.ndarray | pd.Series


def label(text: str) -> str:
    """Plotly renders a subset of HTML in names and titles; show user strings literally."""
    return html.escape(str(text), quote=False)


def ema(y: np.ndarray, smoothing: float) -> np.ndarray:
    """TensorBoard-style debiased exponential moving average (``smoothing`` = weight of the
    past, 0 = raw); NaNs are skipped, not propagated."""
    if smoothing <= 0:
        return np.asarray(y, dtype=float)
    return (
        pd.Series(y, dtype=float)
        .ewm(alpha=1 - smoothing, adjust=True, ignore_na=True)
        .mean()
        .to_numpy()
    )


def lines(
    series: list[Series],
    title: str = "",
    x_title: str = "step",
    smoothing: float = 0.0,
    log_y: bool = False,
    height: int = 320,
) -> go.Figure:
    """Curves overlaid, one colour per series; with ``smoothing`` the EMA is drawn solid and
    the raw curve faint behind it. WebGL traces, each downsampled to :data:`MAX_POINTS`."""
    traces = []
    for i, s in enumerate(series):
        x = np.asarray(s.x)
        y = pd.to_numeric(pd.Series(s.y), errors="coerce").to_numpy(dtype=float)
        color, name = COLORS[i % len(COLORS)], label(s.name)
        if smoothing > 0:
            keep = downsample(y)
            traces.append(
                go.Scattergl(
                    x=x[keep],
                    y=y[keep],
                    mode="lines",
                    name=name,
                    legendgroup=name,
                    showlegend=False,
                    hoverinfo="skip",
                    opacity=0.25,
                    line={"color": color, "width": 1},
                )
            )
            y = ema(y, smoothing)
        keep = downsample(y)
        traces.append(
            go.Scattergl(
                x=x[keep],
                y=y[keep],
                mode="lines+markers" if len(keep) < 30 else "lines",
                name=name,
                legendgroup=name,
                line={"color": color, "width": 2},
            )
        )
    figure = go.Figure(traces)
    figure.update_layout(
        title=label(title),
        height=height,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        hovermode="x",
        legend={"orientation": "h", "y": -0.2},
    )
    figure.update_xaxes(title=x_title)
    figure.update_yaxes(type="log" if log_y else "linear")
    return figure


def schedule(preview: pd.DataFrame) -> go.Figure:
    """The learning rate (and momentum, on a second axis) over the whole run, by epoch."""
    figure = make_subplots(specs=[[{"secondary_y": True}]])
    custom = preview[["step"]].to_numpy()
    figure.add_trace(
        go.Scatter(
            x=preview["epoch"],
            y=preview["lr"],
            name="learning rate",
            customdata=custom,
            hovertemplate=HOVER.format(name="lr"),
        )
    )
    if "momentum" in preview and preview["momentum"].notna().any():
        figure.add_trace(
            go.Scatter(
                x=preview["epoch"],
                y=preview["momentum"],
                name="momentum",
                line={"dash": "dot"},
                customdata=custom,
                hovertemplate=HOVER.format(name="momentum"),
            ),
            secondary_y=True,
        )
    figure.update_layout(
        title="Schedule over the whole run",
        height=320,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        legend={"orientation": "h", "y": -0.25},
    )
    figure.update_xaxes(title="epoch")
    # both are >= 0: start the axes at 0, so a constant schedule is not drawn around -1..1
    figure.update_yaxes(title="learning rate", rangemode="tozero", secondary_y=False)
    figure.update_yaxes(title="momentum", rangemode="tozero", secondary_y=True)
    return figure


def trust_heatmap(rows: pd.DataFrame) -> go.Figure | None:
    """Per-layer LARS trust ratios (``trust_ratio/<variable>`` columns) over steps, or ``None``
    when there are none."""
    columns = [c for c in rows.columns if c.startswith("trust_ratio/")]
    if not columns or "step" not in rows or rows.empty:
        return None
    rows = rows.sort_values("step")
    if len(rows) > MAX_POINTS:
        rows = rows.iloc[:: int(np.ceil(len(rows) / MAX_POINTS))]
    z = rows[columns].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float).T
    names = [label(c.removeprefix("trust_ratio/")) for c in columns]
    figure = go.Figure(
        go.Heatmap(
            z=z,
            x=rows["step"].to_numpy(),
            y=names,
            colorscale="Viridis",
            colorbar={"title": "trust ratio"},
            hovertemplate="step %{x}<br>%{y}<br>ratio %{z:.4g}<extra></extra>",
        )
    )
    figure.update_layout(
        title="Per-layer trust ratio",
        height=max(260, 40 + 22 * len(columns)),
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
    )
    figure.update_xaxes(title="step")
    return figure
