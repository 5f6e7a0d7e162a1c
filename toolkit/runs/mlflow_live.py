"""Rank 0's live MLflow mirror of a training run: a config's ``logging.mlflow`` section.

A thread follows the run's ``events.jsonl`` every :data:`EVERY_S` seconds and logs what is new
to MLflow, with the names, values and MLflow run :mod:`toolkit.runs.mlflow_export` gives (its
first round, and any round after a failure or a rewound log, is a whole export: it fills what
MLflow lacks and adds nothing twice). The events stay the truth on disk, and training never
waits on MLflow:

- MLflow is imported, and every request sent, in the thread (a daemon);
- its HTTP requests are not retried and time out after :data:`REQUEST_TIMEOUT_S` (unless the
  environment sets ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` or ``MLFLOW_HTTP_REQUEST_TIMEOUT``);
- a round that fails is said once on stdout (the run's log), with the command that catches
  MLflow up; later rounds keep trying, so a server back up is caught up by the mirror itself;
- :meth:`LiveMirror.close` gives the last round and the run's end at most :data:`CLOSE_S`.

An elastic run is mirrored by its first rank 0 only.
"""

from __future__ import annotations

import shlex
import threading
import time
from typing import Self

from toolkit.runs.events import EventTail
from toolkit.runs.rundir import RunDir, short_error
from toolkit.runs.states import State
from toolkit.sections import MlflowConfig

EVERY_S = 2.0
REQUEST_TIMEOUT_S = 5
CLOSE_S = 15.0


class LiveMirror:
    """Mirror ``run`` to the MLflow store ``settings`` names while it trains; :meth:`start`
    it, then :meth:`close` it with the run's end."""

    def __init__(self, run: RunDir, settings: MlflowConfig, every_s: float = EVERY_S):
        self.run, self.settings, self.every_s = run, settings, every_s
        self.warned = False
        self._destination = None
        self._mlflow_id: str | None = None
        self._epoch_at: int | None = None  # the step of the last epoch point logged
        self._tail = EventTail(run.events_path)
        self._closing = threading.Event()
        self._ended: State | None = None
        self._thread = threading.Thread(target=self._follow, name="mlflow-mirror", daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def close(self, ended: State | None) -> None:
        """Log the last records and, where ``ended`` is given, the run's end (its MLflow
        status); waits at most :data:`CLOSE_S`."""
        self._ended = ended
        self._closing.set()
        self._thread.join(CLOSE_S)
        if self._thread.is_alive():
            self._say(f"did not answer within {CLOSE_S:.0f} s at the run's end")

    def _follow(self) -> None:
        while not self._closing.wait(self.every_s):
            self._round()
        self._round(ended=self._ended)

    def _round(self, ended: State | None = None) -> None:
        """Log the new records (the whole run on the first round, after a failure, or after
        the log was rewound), then ``ended``, if given; a failure is said once."""
        try:
            from toolkit.runs import mlflow_export  # MLflow's import: here, off training's path

            if self._destination is None:
                mlflow_export.fail_fast(retries=0, timeout_s=REQUEST_TIMEOUT_S)
                self._destination = mlflow_export.Destination(
                    self.settings.tracking_uri, self.settings.experiment, self.run.path.parent
                )
            frame = self._tail.read_new()
            points = mlflow_export.metric_points(frame)
            if self._mlflow_id is None or self._tail.restarted:
                export = mlflow_export.export(self.run, self._destination, points)
                self._mlflow_id = export.mlflow_run_id
            elif len(points):  # epoch is one point a step: not again where the last read ended
                new = points[(points["name"] != "epoch") | (points["step"] != self._epoch_at)]
                mlflow_export.log_points(self._destination.client, self._mlflow_id, new)
            epochs = points.loc[points["name"] == "epoch", "step"]
            self._epoch_at = epochs.iloc[-1] if len(epochs) else self._epoch_at
            if ended is not None:  # as recorded, where training recorded it (not a supervisor)
                status = self.run.recorded_status()
                if status.get("state") != ended:
                    status = {"state": ended, "finished": time.time()}
                mlflow_export.set_status(self._destination.client, self._mlflow_id, status)
        except Exception as error:  # noqa: BLE001 - whatever MLflow raises, training goes on
            self._tail, self._mlflow_id = EventTail(self.run.events_path), None
            self._say(f"failed: {short_error(error)}")

    def _say(self, what: str) -> None:
        """One warning in the run's log, the first time something goes wrong."""
        if self.warned:
            return
        self.warned = True
        where = self.settings.tracking_uri or "the runs root's .mlflow/mlflow.db"
        print(
            f"warning: MLflow ({where}) {what}; training goes on and its events stay on "
            f"disk: `{self.catch_up()}` catches MLflow up (this is said once)",
            flush=True,
        )

    def catch_up(self) -> str:
        """The command that brings this run's MLflow run up to date, as it runs from any
        directory: the runs root, the store and the experiment this mirror logs to."""
        command = ["python", "-m", "toolkit", "--runs", str(self.run.path.parent.resolve())]
        command += ["export", "mlflow", self.run.run_id]
        command += ["--tracking-uri", self.settings.tracking_uri] * bool(self.settings.tracking_uri)
        command += ["--experiment", self.settings.experiment] * bool(self.settings.experiment)
        return shlex.join(command)
