"""Following a run from its run directory, as the terminal, notebooks and scripts do. The run's
events file is read as it grows (:class:`~toolkit.runs.events.EventTail`). Nothing here talks to a
training process, so a run started by the app, the terminal or this kernel is watched alike.

Two views share one loop (:func:`watch`):

- :func:`follow`: a ``keras.utils.Progbar`` over the run's steps on a terminal; off one (a pipe,
  a log file, CI) a plain line per epoch the run finishes, without the bar's ANSI codes and
  ``\\r`` frames.
- :func:`live`: in a notebook, the run's curves drawn in one Plotly figure that grows in place
  under a progress line (:class:`LiveView`). Anywhere else it falls back to
  :func:`follow`. ``train(config, live=True)`` shows the same view for a run trained in the
  notebook's own kernel.
"""

from __future__ import annotations

import html
import math
import sys
import time
from collections.abc import Callable

import pandas as pd

from toolkit.runs import curves as curves_lib
from toolkit.runs.events import EventTail
from toolkit.runs.rundir import LIVE, RunDir
from toolkit.runs.states import State

# (label on the bar, phase of the event, column): the newest value of each is shown.
SHOWN = (("epoch", None, "epoch"), ("loss", "train", "loss"), ("test_acc", "eval", "accuracy"))


def watch(
    run: RunDir,
    view=None,
    *,
    stop_when: Callable[[RunDir], bool] | None = None,
    poll_s: float = 0.5,
    timeout_s: float | None = None,
) -> dict:
    """Refresh ``view`` from ``run`` every ``poll_s`` seconds until the run ends, or until
    ``stop_when(run)`` is true, then close the view and return the run's status. Raises
    ``TimeoutError`` if the run is still going after ``timeout_s`` seconds.

    A view has ``refresh(status)`` and ``close(status)``. The status is read before the events,
    so the refresh that sees a final state has read every event the run wrote.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        status = run.status()
        if view is not None:
            view.refresh(status)
        if status["state"] not in LIVE or (stop_when is not None and stop_when(run)):
            if view is not None:
                view.close(status)
            return status
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{run.run_id} still {status['state']} after {timeout_s} s")
        time.sleep(poll_s)


def follow(
    run: RunDir,
    *,
    progress: bool = True,
    resumed: bool = False,
    stop_when: Callable[[RunDir], bool] | None = None,
    poll_s: float = 0.5,
    timeout_s: float | None = None,
) -> dict:
    """Wait until ``run`` ends, or until ``stop_when(run)`` is true, and return its status.

    With ``progress``, a bar counts the run's steps up to the ``total_steps`` that training
    records in ``meta.json`` once it has its data, with the newest epoch, train loss and test
    accuracy (off a terminal: :class:`ProgressLines`; ``resumed``: from the step a resume
    starts at, its history untold). Raises ``TimeoutError`` if the run is still going after
    ``timeout_s`` seconds.
    """
    view = None
    if progress:
        view = ProgressBar(run) if sys.stdout.isatty() else ProgressLines(run, resumed)
    return watch(run, view, stop_when=stop_when, poll_s=poll_s, timeout_s=timeout_s)


def live(
    run: RunDir,
    *,
    stop_when: Callable[[RunDir], bool] | None = None,
    poll_s: float = 1.0,
    timeout_s: float | None = None,
) -> dict:
    """Show ``run``'s curves updating in place until it ends (or ``stop_when(run)``), and
    return its status. In a notebook this is a :class:`LiveView`; in a terminal or script,
    :func:`follow`'s progress bar. A run that has already ended is drawn once."""
    if not in_notebook():
        return follow(run, stop_when=stop_when, poll_s=poll_s, timeout_s=timeout_s)
    view = LiveView(run)
    view.show()
    return watch(run, view, stop_when=stop_when, poll_s=poll_s, timeout_s=timeout_s)


def _grown(events: pd.DataFrame, tail: EventTail) -> tuple[pd.DataFrame, bool]:
    """``events`` with the rows ``tail`` has read since, and whether the file was rewound (a
    resume truncated it): then its rows from the start, in place of ``events``."""
    new = tail.read_new()
    if tail.restarted:
        return new, True
    return (events if new.empty else pd.concat([events, new], ignore_index=True)), False


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel, where widgets can be shown."""
    ipython = sys.modules.get("IPython")  # never imported here: a terminal needs none of it
    shell = ipython.get_ipython() if ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def latest_values(events: pd.DataFrame) -> list[tuple[str, float]]:
    """``(label, value)`` of the newest epoch, train loss and test accuracy in ``events``,
    for those it has."""
    values = []
    for label, phase, column in SHOWN:
        if column not in events or (phase is not None and "phase" not in events):
            continue
        rows = events if phase is None else events[events["phase"] == phase]
        found = rows[column].dropna()
        if len(found):
            values.append((label, float(found.iloc[-1])))
    return values


def _position(events: pd.DataFrame) -> tuple[str, int] | None:
    """Where a run stands, in the units of its ``total_steps``: AdaScale's clock ``τ`` (the
    base run's updates) where its events have it, else the newest step."""
    for column, label in (("tau", "τ"), ("step", "step")):
        found = events[column].dropna() if column in events else ()
        if len(found):
            return label, int(found.max())
    return None


class ProgressBar:
    """The terminal view: a ``keras.utils.Progbar`` over the run's steps, created once
    training has recorded ``total_steps`` in ``meta.json``."""

    def __init__(self, run: RunDir):
        self.run, self.tail, self.bar, self.step = run, EventTail(run.events_path), None, 0

    def refresh(self, status: dict) -> None:
        new = self.tail.read_new()
        if self.bar is None and (total := self.run.meta().get("total_steps")):
            import keras

            labels = [label for label, *_ in SHOWN]
            self.bar = keras.utils.Progbar(total, stateful_metrics=labels, unit_name="step")
        position = _position(new)
        if self.bar is not None and position is not None:
            self.step = min(position[1], self.bar.target)
            self.bar.update(self.step, values=latest_values(new))

    def close(self, status: dict) -> None:
        """End the bar's line: full if the run completed, else where it stopped."""
        if self.bar is not None and self.step < self.bar.target:
            done = status["state"] == State.COMPLETED
            self.bar.update(self.bar.target if done else self.step, finalize=True)


class ProgressLines:
    """The view off a terminal: a line for each epoch the run finishes (at its ``eval``
    event), and one where it ends between epochs, each saying where it was and its newest
    values then. Each is told once: a resume rewinds the events to its checkpoint and marks
    the place (a ``resume`` event), and the lines go on from there; a view of a ``resumed``
    run starts there, its history untold."""

    def __init__(self, run: RunDir, resumed: bool = False):
        self.run, self.tail, self.events = run, EventTail(run.events_path), pd.DataFrame()
        self.told = None if resumed else 0  # rows of events the last line covered

    def refresh(self, status: dict) -> None:
        self.events, rewound = _grown(self.events, self.tail)
        if self.told is None:  # a resumed run's history, as it was when the view began
            self.told = len(self.events)
        elif rewound:
            phases = self.events["phase"] if "phase" in self.events else pd.Series()
            resumes = self.events.index[phases == "resume"] if len(phases) else []
            self.told = resumes[-1] + 1 if len(resumes) else len(self.events)
        if "phase" in self.events:
            ends = self.events.index[self.events["phase"] == "eval"]
            for end in ends[ends >= self.told]:
                self._say(end + 1)

    def close(self, status: dict) -> None:
        self.refresh(status)
        if len(self.events) > self.told and _position(self.events) != self._told_position:
            self._say(len(self.events))

    @property
    def _told_position(self):
        return _position(self.events.iloc[: self.told])

    def _say(self, rows: int) -> None:
        """A line for the first ``rows`` events."""
        events, total = self.events.iloc[:rows], self.run.meta().get("total_steps")
        label, step = _position(events) or ("step", 0)
        where = f"{label} {step}/{total}" if total else f"{label} {step}"
        values = [f"{name}: {value:.4g}" for name, value in latest_values(events)]
        print(" - ".join([where, *values]), flush=True)
        self.told = rows


class LiveView:
    """The notebook view: a progress line over one Plotly figure of the run's panels
    (:func:`toolkit.runs.curves.panels`, two to a row, each with its own legend).

    While the run goes on, the figure is drawn anew in an ``ipywidgets.Output`` at each change
    (JupyterLab's Plotly renderer never redraws an output updated in place). When the run ends,
    the final figure replaces that widget as a plain output and the widget is closed: the saved
    notebook shows the figure when reopened without a kernel, and weighs what the figure weighs
    (a Plotly ``FigureWidget`` per panel carried the 5 MB plotly.js bundle each in the saved
    widget state: 56 MB for the quickstart's eleven panels).

    A panel appears when its first number does; a curve is redrawn only when it has new rows,
    thinned to :data:`toolkit.runs.curves.MAX_POINTS` points. ``refresh`` may be called as often as
    wanted: ``at_most_every_s`` skips calls that come sooner (a training callback's pace).
    """

    PANEL_HEIGHT = 280
    COLUMNS = 2
    LEGEND_AT_MOST = 8
    """Curves a panel names in its legend; a panel of more (a trust ratio per layer) names them
    on hover only."""

    def __init__(self, run: RunDir):
        from plotly.graph_objects import Figure  # its imports paid here, not mid-run
        from plotly.subplots import make_subplots

        from toolkit.runs import theme  # the dashboard's look

        self._template, self._colors, self._subplots = theme.NAME, theme.COLORS, make_subplots
        self.run = run
        self.tail = EventTail(run.events_path)
        self.events = pd.DataFrame()
        self.figure = Figure(layout={"template": self._template})
        self.panels: list[str] = []  # the figure's panel titles, in order
        self._drawn: dict[curves_lib.Curve, tuple[int, int]] = {}  # -> (trace index, rows drawn)
        self._last_refresh = -math.inf
        self.total: int | None = None  # steps, from meta.json once training has written it
        self.line = ""  # the progress line's text (HTML)
        self.done = 0.0  # the progress bar's fraction
        self.outcome = ""  # "success" once completed, "danger" once failed
        self._handles: tuple | None = None

    def show(self) -> None:
        """Put the progress line and the figure under the running cell."""
        import ipywidgets
        from IPython.display import HTML, display

        self._html, self._live = HTML, ipywidgets.Output()
        self._handles = (
            display(HTML(self._header()), display_id=True),
            display(self._live, display_id=True),  # the figure while the run goes on
        )

    def refresh(self, status: dict | None = None, *, at_most_every_s: float = 0.0) -> None:
        """Read the events appended since the last call, extend the curves, rewrite the line."""
        now = time.monotonic()
        if now - self._last_refresh < at_most_every_s:
            return
        self._last_refresh = now
        status = status if status is not None else self.run.status()
        self.events, rewound = _grown(self.events, self.tail)
        self.panels = [] if rewound else self.panels  # drawn again from the file
        figure_changed = self._draw()
        self._progress(status)
        if self._handles is not None:
            self._handles[0].update(self._html(self._header()))
            if figure_changed and self.panels:
                # drawn anew: a plot's output, updated in place, keeps its first curves drawn
                from IPython.display import clear_output, display

                with self._live:
                    clear_output(wait=True)
                    display(self._bundle(), raw=True)

    def close(self, status: dict) -> None:
        """The last refresh: the run ended (or the watch was asked to stop). In a notebook the
        final figure then replaces the live one as a plain output, which the saved notebook
        keeps and shows when reopened without a kernel."""
        self.refresh(status)
        if self._handles is not None:
            if self.panels:
                self._handles[1].update(self._bundle(), raw=True)
            self._live.close()

    def _bundle(self) -> dict:
        """The figure as the notebook's Plotly renderer gives it (a Figure displayed itself
        would ignore a display's id)."""
        return self.figure._repr_mimebundle_()

    def curve(self, panel: str, name: str) -> tuple[list, list]:
        """``(x, y)`` drawn for curve ``name`` of ``panel`` (its title as the run's columns
        name it: ``loss``, ``trust_ratio``)."""
        at = self.panels.index(panel)
        for trace in self.figure.data:
            if trace.xaxis == _axis("x", at) and trace.name == html.escape(name):
                return list(trace.x), list(trace.y)
        raise KeyError(f"{panel}: no curve {name!r}")

    def _draw(self) -> bool:
        """Bring the figure up to the events; whether anything in it changed."""
        found = curves_lib.panels(self.events)
        changed = list(found) != self.panels
        if changed:
            self._lay_out(list(found))
        for at, curves in enumerate(found.values()):
            named = len(curves) <= self.LEGEND_AT_MOST
            for color, curve in enumerate(curves):
                changed |= self._draw_curve(
                    curve, at, self._colors[color % len(self._colors)], named
                )
        return changed

    def _lay_out(self, panels: list[str]) -> None:
        """A new figure with a grid cell and a legend (inside its top right) per panel; every
        curve is drawn again."""
        self.panels, self._drawn = panels, {}
        rows = max(1, -(-len(panels) // self.COLUMNS))
        titles = [html.escape(curves_lib.TITLES.get(t, t)) for t in panels]
        figure = self._subplots(
            rows=rows, cols=self.COLUMNS, subplot_titles=titles or None, vertical_spacing=0.4 / rows
        )
        figure.update_layout(
            template=self._template,
            height=self.PANEL_HEIGHT * rows,
            margin={"l": 50, "r": 10, "t": 40, "b": 40},
            meta={"live_view": self.run.run_id},  # which run a saved figure draws
        )
        figure.update_xaxes(title_text="step", title_standoff=4)
        for unused in range(len(panels), rows * self.COLUMNS):  # an odd panel's neighbour
            figure.layout[_axis("xaxis", unused)].visible = False
            figure.layout[_axis("yaxis", unused)].visible = False
        for at in range(len(panels)):
            x = figure.layout[_axis("xaxis", at)].domain
            y = figure.layout[_axis("yaxis", at)].domain
            figure.layout[_axis("legend", at)] = {
                "x": x[1],
                "y": y[1],
                "xanchor": "right",
                "yanchor": "top",
                "bgcolor": "rgba(255,255,255,0.6)",
                "font": {"size": 10},
            }
        self.figure = figure

    def _draw_curve(self, curve: curves_lib.Curve, at: int, color: str, named: bool) -> bool:
        """Draw ``curve`` in panel ``at`` if it has rows not drawn yet; whether it had."""
        rows = self.events.loc[self.events["phase"] == curve.phase, ["step", curve.column]]
        rows = rows.dropna()
        index, drawn = self._drawn.get(curve, (None, -1))
        if len(rows) == drawn:
            return False
        if index is None:
            self.figure.add_scatter(
                name=html.escape(curve.name),
                xaxis=_axis("x", at),
                yaxis=_axis("y", at),
                legend=_axis("legend", at),
                showlegend=named,
                line={"color": color},
            )
            index = len(self.figure.data) - 1
        x, y = rows["step"].to_numpy(), rows[curve.column].to_numpy(dtype=float)
        keep = curves_lib.downsample(y)
        trace = self.figure.data[index]
        trace.x, trace.y = x[keep], y[keep]
        trace.mode = "lines+markers" if len(keep) < 30 else "lines"
        self._drawn[curve] = (index, len(rows))
        return True

    def _header(self) -> str:
        color = {"success": "#2ca02c", "danger": "#d62728"}.get(self.outcome, "#1f77b4")
        bar = f'<progress value="{self.done:.4f}" max="1" style="width:30%;accent-color:{color}">'
        return f"<div>{bar}</progress> {self.line}</div>"

    def _progress(self, status: dict) -> None:
        state = status.get("state") or "unknown"
        self.total = self.total or self.run.meta().get("total_steps")
        total, position = self.total, _position(self.events)
        label, step = position or ("step", None)
        parts = [f"<b>{html.escape(self.run.run_id)}</b>", html.escape(state)]
        if step is not None:
            parts.append(f"{label} {step:,}" + (f" / {total:,}" if total else ""))
        parts += [f"{label} {value:.4g}" for label, value in latest_values(self.events)]
        if state not in LIVE and status.get("reason"):
            parts.append(html.escape(str(status["reason"])))
        self.line = " · ".join(parts)
        if total:
            self.done = 1.0 if state == State.COMPLETED else min(1.0, (step or 0) / total)
        self.outcome = {State.COMPLETED: "success", State.FAILED: "danger"}.get(state, "")


def _axis(kind: str, at: int) -> str:
    """The name of panel ``at``'s axis (``x``, ``y``, ``xaxis``, ``yaxis``) or legend: Plotly
    numbers the second and later ones (``x2``, ``legend3``)."""
    return kind if at == 0 else f"{kind}{at + 1}"
