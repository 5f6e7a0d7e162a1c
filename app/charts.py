"""Plotly figures for the dashboard: overlaid curves (downsampled), the schedule preview and the
per-layer trust-ratio heatmap. Pure functions of DataFrames; no Streamlit.

Curves are SVG traces, not WebGL: in headless Chromium (software GL) the Compare page's 3 charts
of 100 runs took 23 s to draw as WebGL and 4 s as SVG, and a page of many charts never runs
into the browser's limit on WebGL contexts. SVG stays fast because a chart holds at most
:data:`CHART_POINTS` points."""

from __future__ import annotations

import html
import textwrap
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from toolkit.runs.curves import MAX_POINTS, downsample, wide
from toolkit.runs.theme import COLORS

CHART_POINTS = 60_000
"""Points drawn per chart at most: each of its traces keeps ``CHART_POINTS / traces`` (at most
:data:`~toolkit.runs.curves.MAX_POINTS`, at least :data:`FEWEST_POINTS`)."""
FEWEST_POINTS = 200
HOVER = "epoch %{{x:.2f}} (step %{{customdata[0]}})<br>{name} %{{y:.4g}}<extra></extra>"


@dataclass
class Series:
    """One curve: a name, aligned x/y arrays, and optionally its colour (a run's, from
    :func:`app.data.color`; default: the next of :data:`COLORS`) and dash. An ``exact`` curve
    (a value the run set, :data:`~toolkit.runs.curves.EXACT`) is never smoothed."""

    name: str
    x: np.ndarray | pd.Series
    y: np.ndarray | pd.Series
    color: str | None = None
    dash: str = "solid"
    exact: bool = False


def label(text: str) -> str:
    """Plotly renders a subset of HTML in names and titles; show user strings literally."""
    return html.escape(str(text), quote=False)


SMOOTHING = 0.6
"""The EMA smoothing every page's curves start at: TensorBoard's default, so a curve reads the
same on Run detail and Compare (the raw one is drawn faintly behind it)."""


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
    """Curves overlaid, one colour per series; with ``smoothing`` the EMA (of the full-resolution
    curve) of each series that is not ``exact`` is drawn solid and the raw curve faint behind
    it. Each trace is downsampled to its share of :data:`CHART_POINTS`. The traces are plain
    dicts of known-good properties, so Plotly skips validating them (a third of the time for a
    chart of 100 runs)."""
    traces, drawn_x, drawn_y = [], [], []
    smoothed = [smoothing > 0 and not s.exact for s in series]
    per_trace = CHART_POINTS // max(1, len(series) + sum(smoothed))
    points = min(MAX_POINTS, max(FEWEST_POINTS, per_trace))
    for i, (s, smooth) in enumerate(zip(series, smoothed, strict=True)):
        x = np.asarray(s.x)
        y = pd.to_numeric(pd.Series(s.y), errors="coerce").to_numpy(dtype=float)
        color, name = s.color or COLORS[i % len(COLORS)], label(s.name)
        if smooth:
            keep = downsample(y, points)
            faint = {"hoverinfo": "skip", "opacity": 0.25, "showlegend": False}
            traces.append(_trace(x[keep], y[keep], name, color, width=1, **faint))
            y = ema(y, smoothing)
        keep = downsample(y, points)
        drawn_x.append(x[keep])
        drawn_y.append(y[keep])
        mode = "lines+markers" if len(keep) < 30 else "lines"
        traces.append(_trace(x[keep], y[keep], name, color, width=2, mode=mode, dash=s.dash))
    layout = _layout(title, x_title, height, _x_ticks(drawn_x), _y_axis(drawn_y, log_y))
    return go.Figure({"data": traces, "layout": layout}, _validate=False)


VALUE_TICKS = 12
"""A scatter's numeric x of at most this many values gets a tick at each."""


def scatter(
    runs: pd.DataFrame, x: str, y: str, color: str | None = None, y_title: str | None = None
) -> go.Figure:
    """One point per run (a row of ``runs``, named by its ``run_id``): column ``y`` against
    column ``x``, coloured by column ``color``; a log x-axis where ``x`` is
    :func:`~toolkit.runs.curves.wide`; a numeric ``x`` of at most :data:`VALUE_TICKS` values
    has a tick at each value, labelled as the config gives it (Plotly's own ticks on a
    momentum of 0.9 read 0.181, 0.362, ...)."""
    traces = []
    groups = runs.groupby(color, sort=True, dropna=False) if color else [(None, runs)]
    for i, (value, group) in enumerate(groups):
        name = f"{color}={value}" if color else "runs"
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "x": group[x].tolist(),
                "y": group[y].tolist(),
                "text": [label(r) for r in group["run_id"]],
                "name": label(name),
                "marker": {"size": 10, "color": COLORS[i % len(COLORS)]},
                "hovertemplate": "%{text}<br>%{x}: %{y:.4g}<extra></extra>",
            }
        )
    layout = _layout(f"{y_title or y} against {x}", x, 380, {}, {"title": {"text": y_title or y}})
    layout["xaxis"]["type"] = "log" if wide(runs[x]) else "-"
    values = pd.to_numeric(runs[x], errors="coerce").dropna().unique()
    if 0 < len(values) <= VALUE_TICKS and len(values) == runs[x].dropna().nunique():
        ticks = sorted(values)
        layout["xaxis"] |= {"tickvals": ticks, "ticktext": [f"{t:g}" for t in ticks]}
    layout["hovermode"] = "closest"
    layout["showlegend"] = bool(color)
    return go.Figure({"data": traces, "layout": layout}, _validate=False)


@dataclass
class Band:
    """A group of runs' curves as one (:func:`toolkit.runs.curves.spread`): its name, colour and
    the frame of ``x``, ``mean``, ``low`` and ``high``."""

    name: str
    spread: pd.DataFrame
    color: str


def bands(
    groups: list[Band], title: str = "", x_title: str = "step", log_y: bool = False, height=320
) -> go.Figure:
    """Each group's mean as a line over its min-max band (filled faintly in its colour), each
    downsampled to its share of :data:`CHART_POINTS`."""
    traces, drawn_x, drawn_y = [], [], []
    points = min(MAX_POINTS, max(FEWEST_POINTS, CHART_POINTS // max(1, 3 * len(groups))))
    for group in groups:
        keep = downsample(group.spread["mean"].to_numpy(), points)
        rows = group.spread.iloc[keep]
        x, name = rows["x"].to_numpy(), label(group.name)
        fill = _faint(group.color)
        edge = {"hoverinfo": "skip", "showlegend": False, "line": {"width": 0}}
        traces.append(_trace(x, rows["low"].to_numpy(), name, group.color, 0) | edge)
        traces.append(
            _trace(x, rows["high"].to_numpy(), name, group.color, 0)
            | edge
            | {"fill": "tonexty", "fillcolor": fill}
        )
        traces.append(_trace(x, rows["mean"].to_numpy(), name, group.color, width=2))
        drawn_x.append(x)
        drawn_y += [rows[c].to_numpy() for c in ("low", "high")]
    layout = _layout(title, x_title, height, _x_ticks(drawn_x), _y_axis(drawn_y, log_y))
    return go.Figure({"data": traces, "layout": layout}, _validate=False)


def _layout(title: str, x_title: str, height: int, x_ticks: dict, y_axis: dict) -> dict:
    """A curves chart's layout: title (:func:`title_lines`), height, a legend below, one hover
    for every curve."""
    lines = title_lines(title)
    return {
        "title": {"text": "<br>".join(map(label, lines))},
        "height": height,
        "margin": {"l": 10, "r": 10, "t": 22 + 18 * len(lines), "b": 10},
        "hovermode": "x",
        "legend": {"orientation": "h", "y": -0.2},
        "xaxis": {"title": {"text": x_title}, **x_ticks},
        "yaxis": y_axis,
    }


TITLE_CHARS = 48
"""The most characters of a title line: a chart in half of the page's width (Run detail's two
to a row) shows about 52 of Plotly's title font before it cuts the rest off."""


def title_lines(title: str) -> list[str]:
    """``title`` broken at spaces into lines of at most :data:`TITLE_CHARS`, so that no chart
    cuts its title."""
    return textwrap.wrap(str(title), TITLE_CHARS) or [""]


def _faint(color: str) -> str:
    """``color`` (``#rrggbb``) at a fifth of its opacity."""
    red, green, blue = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({red},{green},{blue},0.2)"


def _x_ticks(xs: list[np.ndarray]) -> dict:
    """A tick per whole number where x holds whole numbers (steps) spanning fewer than ten,
    never fractional steps; Plotly's own choice otherwise."""
    values = np.concatenate(xs) if xs else np.array([])
    if values.dtype.kind not in "iuf" or not len(values) or not np.isfinite(values).all():
        return {}
    whole = bool(np.all(values == np.round(values)))
    return {"dtick": 1} if whole and np.ptp(values) < 10 else {}


def _y_axis(ys: list[np.ndarray], log_y: bool) -> dict:
    """The y axis. Linear: from zero when the curves are flat (a constant byte count reads as
    ``20,840``, not as ticks ``20.839k``..``20.841k``). Log: ticks at the powers of ten that
    the data spans, or at five round values between its ends when it spans less than a decade,
    each labelled in full (Plotly's own labels a short log axis ``4 5 6 ... 100 2 3``)."""
    values = np.concatenate(ys) if ys else np.array([])
    values = values[np.isfinite(values)]
    if not log_y:
        flat = len(values) and np.ptp(values) <= 1e-6 * np.abs(values).max()
        return {"type": "linear", "rangemode": "tozero"} if flat else {"type": "linear"}
    values = values[values > 0]
    if not len(values):
        return {"type": "log"}
    low, high = np.log10(values.min()), np.log10(values.max())
    if np.floor(high) - np.ceil(low) >= 1:  # two or more powers of ten inside
        ticks = 10.0 ** np.arange(np.ceil(low), np.floor(high) + 1)
    else:
        ticks = np.unique([float(f"{t:.2g}") for t in np.geomspace(10**low, 10**high, 5)])
    return {"type": "log", "tickvals": ticks, "ticktext": [f"{t:,.6g}" for t in ticks]}


def _trace(
    x, y, name: str, color: str, width: int, mode: str = "lines", dash: str = "solid", **extra
) -> dict:
    line = {"color": color, "width": width, "dash": dash}
    return {"type": "scatter", "x": x, "y": y, "mode": mode, "name": name} | {
        "legendgroup": name,
        "line": line,
        **extra,
    }


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
