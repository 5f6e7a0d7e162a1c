"""Following a run from its run directory, as the terminal, notebooks and scripts do. The run's
events file is read as it grows (:class:`~toolkit.runs.events.EventTail`). Nothing here talks to a
training process, so a run started by the app, the terminal or this kernel is watched alike.

Two views share one loop (:func:`watch`):

- :func:`follow`: a ``keras.utils.Progbar`` over the run's steps, for terminals and scripts.
- :func:`live`: in a notebook, the run's curves drawn as Plotly ``FigureWidget``s that grow in
  place under a progress line (:class:`LiveView`). Anywhere else it falls back to
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
    stop_when: Callable[[RunDir], bool] | None = None,
    poll_s: float = 0.5,
    timeout_s: float | None = None,
) -> dict:
    """Wait until ``run`` ends, or until ``stop_when(run)`` is true, and return its status.

    With ``progress``, a bar counts the run's steps up to the ``total_steps`` that training
    records in ``meta.json`` once it has its data, with the newest epoch, train loss and test
    accuracy. Raises ``TimeoutError`` if the run is still going after ``timeout_s`` seconds.
    """
    view = ProgressBar(run) if progress else None
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
            done = status["state"] == "completed"
            self.bar.update(self.bar.target if done else self.step, finalize=True)


class LiveView:
    """The notebook view: a progress line over Plotly ``FigureWidget``s, one per panel of
    :func:`toolkit.runs.curves.panels`, extended in place from the run's events file. The figures
    have a fixed size and wrap to the notebook's width (a figure sized to its container is drawn
    before the container has a width, and overflows it).

    A panel appears when its first number does; a curve is redrawn only when it has new rows,
    thinned to :data:`toolkit.runs.curves.MAX_POINTS` points. ``refresh`` may be called as often as
    wanted: ``at_most_every_s`` skips calls that come sooner (a training callback's pace).
    """

    def __init__(self, run: RunDir, *, width: int = 460, height: int = 280):
        import ipywidgets as widgets
        from plotly.graph_objects import FigureWidget  # a second's imports: paid here, not mid-run

        from toolkit.runs import theme  # the dashboard's look

        self._figure_widget, self._template = FigureWidget, theme.NAME
        self.run, self.size = run, {"width": width, "height": height}
        self.tail = EventTail(run.events_path)
        self.events = pd.DataFrame()
        self.figures: dict[str, object] = {}  # panel title -> FigureWidget
        self._drawn: dict[curves_lib.Curve, tuple[object, int]] = {}  # -> (trace, rows drawn)
        self._last_refresh = -math.inf
        self.total: int | None = None  # steps, from meta.json once training has written it
        self.bar = widgets.FloatProgress(min=0.0, max=1.0, layout={"width": "30%"})
        self.line = widgets.HTML()
        self.grid = widgets.Box(layout={"display": "flex", "flex_flow": "row wrap"})
        self.widget = widgets.VBox([widgets.HBox([self.bar, self.line]), self.grid])

    def show(self) -> None:
        from IPython.display import display

        display(self.widget)

    def refresh(self, status: dict | None = None, *, at_most_every_s: float = 0.0) -> None:
        """Read the events appended since the last call, extend the curves, rewrite the line."""
        now = time.monotonic()
        if now - self._last_refresh < at_most_every_s:
            return
        self._last_refresh = now
        status = status if status is not None else self.run.status()
        new = self.tail.read_new()
        if self.tail.restarted:  # rewound (a resume): draw again from the file
            self.events, self._drawn = new, {}
            for figure in self.figures.values():
                figure.data = ()
        elif not new.empty:
            self.events = pd.concat([self.events, new], ignore_index=True)
        self._draw()
        self._progress(status)

    def close(self, status: dict) -> None:
        """The last refresh: the run ended (or the watch was asked to stop)."""
        self.refresh(status)

    def _draw(self) -> None:
        for title, curves in curves_lib.panels(self.events).items():
            if title not in self.figures:
                self.figures[title] = self._figure_widget(layout=self._layout(title))
                self.grid.children = tuple(self.figures.values())
            figure = self.figures[title]
            with figure.batch_update():
                for curve in curves:
                    self._draw_curve(figure, curve)

    def _draw_curve(self, figure, curve: curves_lib.Curve) -> None:
        rows = self.events.loc[self.events["phase"] == curve.phase, ["step", curve.column]]
        rows = rows.dropna()
        trace, drawn = self._drawn.get(curve, (None, -1))
        if len(rows) == drawn:
            return
        if trace is None:
            figure.add_scatter(name=html.escape(curve.name), mode="lines+markers")
            trace = figure.data[-1]
        x, y = rows["step"].to_numpy(), rows[curve.column].to_numpy(dtype=float)
        keep = curves_lib.downsample(y)
        trace.x, trace.y = x[keep], y[keep]
        trace.mode = "lines+markers" if len(keep) < 30 else "lines"
        self._drawn[curve] = (trace, len(rows))

    def _layout(self, title: str) -> dict:
        return {
            "title": {"text": html.escape(curves_lib.TITLES.get(title, title)), "x": 0.02},
            "template": self._template,
            **self.size,
            "margin": {"l": 50, "r": 10, "t": 40, "b": 40},
            "xaxis": {"title": {"text": "step"}},
            "legend": {"orientation": "h", "y": -0.25},
        }

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
        self.line.value = " · ".join(parts)
        if total:
            self.bar.value = 1.0 if state == "completed" else min(1.0, (step or 0) / total)
        self.bar.bar_style = {"completed": "success", "failed": "danger"}.get(state, "")
