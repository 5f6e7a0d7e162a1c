"""Runs in MLflow: ``python -m toolkit export mlflow RUN...`` (and a run's live mirror,
:mod:`toolkit.runs.mlflow_live`, which syncs with the same functions).

Each lab run is one MLflow run, found again by its tag ``lab.run_id`` in whichever experiment
of the store holds it (a run mirrored live into one experiment and exported later is synced
where it is, never copied into a second); its MLflow name is the lab's run id. A run not yet in
the store goes to the experiment the caller names, by default its sweep's or its search's name
(a sweep or a search is one experiment, its runs side by side in MLflow's compare view; not a
parent run with children, which would be a run with no metrics of its own), else its config's
``name``. What goes in:

- **metrics**: every :func:`~toolkit.runs.events.scalars` value of ``events.jsonl`` (the names
  TensorBoard's export gives: ``train/loss``, ``eval/accuracy``, ``trust_ratio/conv1/kernel``),
  at the record's own step and time (milliseconds), in ``log_batch`` requests within MLflow's
  limits;
- **params**: the config flattened to dotted paths (``optimizer.learning_rate``; ``None`` as
  ``null``), as the TensorBoard export's HParams;
- **tags**: ``lab.run_id``, ``lab.tags`` (the run's tags, comma-separated) and each tag as its
  own (``search:quick`` as key ``search``, value ``quick``; a tag without a colon, value ``""``;
  one whose key MLflow would refuse stays in ``lab.tags`` only), the notes as
  ``mlflow.note.content`` (the run's description in MLflow's UI), the lab's state and reason;
- **artifacts**: ``config.yaml``, ``meta.json`` and the latest checkpoint's ``manifest.json``
  (under ``checkpoints/<name>/``);
- **status**: queued and starting are ``SCHEDULED``, running ``RUNNING``, completed
  ``FINISHED``, failed ``FAILED``, stopped and pruned ``KILLED`` (an end at its own time).

**An export is a sync, never a duplicate.** Each export compares the run's metric histories in
MLflow with the events, as multisets of ``(step, value)`` per name, and logs only what MLflow
lacks, so a second export adds nothing, a run exported while it trained gets the rest later,
and the gaps a live mirror left while its server was down are filled. Where MLflow holds a
point or a param the run does not (the run's log was rewound when it resumed, or its config is
not the one exported), the MLflow run no longer describes the lab's: it is deleted and the run
exported again whole. The run directory itself is only read.

The default tracking store is a SQLite file under the runs root, ``.mlflow/mlflow.db``, its
artifacts beside it (``.mlflow/artifacts``); a URI (``http://host:5000``) reaches a server.
MLflow is imported by this module and the live mirror only.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import requests
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, Run, RunTag, ViewType
from mlflow.exceptions import MlflowException
from mlflow.utils.validation import (
    MAX_METRICS_PER_BATCH,
    MAX_PARAMS_TAGS_PER_BATCH,
    validate_param_and_metric_name,
)
from pydantic import ValidationError

from toolkit.config import ConfigError, format_errors
from toolkit.runs import checkpoints
from toolkit.runs.events import read_events, scalars
from toolkit.runs.rundir import RunDir, runs_root, short_error
from toolkit.runs.states import State
from toolkit.sections import MlflowConfig
from toolkit.words import counted

RUN_ID_TAG = "lab.run_id"
TAGS_TAG = "lab.tags"
NOTE_TAG = "mlflow.note.content"
STATE_TAG = "lab.state"
REASON_TAG = "lab.reason"
STATUS = {
    State.QUEUED: "SCHEDULED",
    State.STARTING: "SCHEDULED",
    State.RUNNING: "RUNNING",
    State.COMPLETED: "FINISHED",
    State.FAILED: "FAILED",
    State.STOPPED: "KILLED",
    State.PRUNED: "KILLED",
}
"""MLflow's status for each lab state (``unreadable`` has none: it is left as it was)."""
TERMINAL = ("FINISHED", "FAILED", "KILLED")
_POINT = ["name", "step", "value"]


@dataclass(frozen=True)
class Exported:
    """What one export did: the MLflow run it reached, the metric points it logged (0 when
    MLflow had them all), and whether the MLflow run was replaced (it contradicted the lab's)."""

    run_id: str
    mlflow_run_id: str
    experiment: str
    points: int
    replaced: bool = False


def default_tracking_uri(root: str | Path | None = None) -> str:
    """The local tracking store: ``sqlite:///<runs root>/.mlflow/mlflow.db``."""
    return f"sqlite:///{(runs_root(root).resolve() / '.mlflow' / 'mlflow.db').as_posix()}"


class Destination:
    """An MLflow tracking store (``tracking_uri``, default :func:`default_tracking_uri` of the
    runs root) and the experiment runs go to (``experiment``, default each run's config
    name), with its client."""

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str | None = None,
        root: str | Path | None = None,
    ):
        self.local = tracking_uri is None
        self.tracking_uri = tracking_uri or default_tracking_uri(root)
        self.experiment = experiment
        self.root = root
        if self.local:
            (runs_root(root) / ".mlflow").mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self._experiment_ids: dict[str, str] = {}

    def experiment_name(self, run: RunDir) -> str:
        """Where ``run`` goes if it is not in the store yet: the destination's experiment, else
        its sweep's or search's name, else its config name (MLflow's ``Default`` where the
        config cannot be read)."""
        if self.experiment:
            return self.experiment
        meta = run.meta()
        if isinstance(named := meta.get("search") or meta.get("sweep"), str):
            return named
        try:
            return run.config().name
        except (OSError, ConfigError):
            return "Default"

    def experiment_id(self, name: str) -> str:
        """The experiment ``name``'s id, created where missing (a local store's artifacts go
        under the runs root, not the working directory)."""
        if name not in self._experiment_ids:
            found = self.client.get_experiment_by_name(name)
            if found is not None:
                self._experiment_ids[name] = found.experiment_id
            else:
                artifacts = None
                if self.local:
                    artifacts = runs_root(self.root).resolve() / ".mlflow" / "artifacts" / name
                    artifacts = artifacts.as_uri()
                self._experiment_ids[name] = self.client.create_experiment(
                    name, artifact_location=artifacts
                )
        return self._experiment_ids[name]

    def find(self, run: RunDir) -> Run | None:
        """The MLflow run of ``run`` (by its ``lab.run_id`` tag) in any active experiment of
        the store, with its params, tags and latest metrics; ``None`` where there is none."""
        experiments, token = [], None
        while True:
            page = self.client.search_experiments(ViewType.ACTIVE_ONLY, page_token=token)
            experiments += [experiment.experiment_id for experiment in page]
            if not (token := page.token):
                break
        found = self.client.search_runs(
            experiments,
            filter_string=f"tags.`{RUN_ID_TAG}` = '{run.run_id}'",
            run_view_type=ViewType.ACTIVE_ONLY,
            max_results=1,
        )
        return found[0] if found else None

    def create(self, run: RunDir) -> str:
        """A new MLflow run for ``run``, named by its id, started when the run started (now,
        where it has not)."""
        started = run.recorded_status().get("started")
        return self.client.create_run(
            self.experiment_id(self.experiment_name(run)),
            start_time=_ms(started) if started else None,
            tags={RUN_ID_TAG: run.run_id},
            run_name=run.run_id,
        ).info.run_id


def export(run: RunDir, destination: Destination, points: pd.DataFrame | None = None) -> Exported:
    """Bring ``run``'s MLflow run up to date (see the module doc): created where missing,
    replaced where it contradicts the run; ``points``: the :func:`metric_points` of all the
    run's events, where the caller has them (the live mirror), else read here."""
    if points is None:
        points = metric_points(read_events(run.events_path))
    params, client = _params(run), destination.client
    found, missing, replaced = destination.find(run), points, False
    if found is not None:
        missing = _missing(client, found, points, params)
        if missing is None:  # MLflow holds what the run does not: the run again, whole
            client.delete_run(found.info.run_id)
            found, missing, replaced = None, points, True
    found = found or client.get_run(destination.create(run))
    mlflow_id, logged = found.info.run_id, found.data
    experiment = client.get_experiment(found.info.experiment_id).name
    tags = _tags(run)
    managed = _tag_keys(logged.tags.get(TAGS_TAG, "")) | {NOTE_TAG, REASON_TAG}
    for key in managed - set(tags):  # what the run no longer has (a tag dropped, a reason)
        if key in logged.tags:
            client.delete_tag(mlflow_id, key)
    _log_batches(
        client,
        mlflow_id,
        params=[Param(k, v) for k, v in params.items() if k not in logged.params],
        tags=[RunTag(k, v) for k, v in tags.items() if logged.tags.get(k) != v],
    )
    log_points(client, mlflow_id, missing)
    _log_artifacts(client, mlflow_id, run)
    set_status(client, mlflow_id, run.status())
    return Exported(run.run_id, mlflow_id, experiment, len(missing), replaced)


def export_all(runs: Iterable[RunDir], destination: Destination) -> list[Exported]:
    """:func:`export` each run to ``destination``; MLflow's refusal, or a server that does not
    answer, is an :class:`ExportError` naming the store (the runs exported before it stay
    exported: exporting again goes on from there)."""
    try:
        return [export(run, destination) for run in runs]
    except (MlflowException, requests.RequestException) as error:
        raise ExportError(f"MLflow at {destination.tracking_uri}: {short_error(error)}") from error


class ExportError(OSError):
    """An export MLflow did not take."""


def export_runs(
    runs: list[RunDir],
    tracking_uri: str | None = None,
    experiment: str | None = None,
    root: str | Path | None = None,
) -> list[str]:
    """The export of the CLI and the Runs page: ``runs`` to the store and experiment named
    (checked as a config's ``logging.mlflow``; unset: the defaults), failing fast where no
    server answers; what was done, a line a run and one in all."""
    try:
        settings = MlflowConfig(tracking_uri=tracking_uri, experiment=experiment)
    except ValidationError as error:
        raise ConfigError(format_errors(error, "MLflow destination")) from error
    fail_fast(retries=1, timeout_s=10)
    destination = Destination(settings.tracking_uri, settings.experiment, root)
    lines = []
    for done in export_all(runs, destination):
        again = " (it contradicted the run: replaced)" if done.replaced else ""
        lines.append(
            f"{done.run_id}: {counted(done.points, 'new metric point')} -> MLflow run "
            f"{done.mlflow_run_id} in experiment {done.experiment!r}{again}"
        )
    return [*lines, f"exported {counted(len(runs), 'run')} to {destination.tracking_uri}"]


def fail_fast(retries: int, timeout_s: float) -> None:
    """Make MLflow's HTTP requests retry ``retries`` times and time out after ``timeout_s``
    (its defaults retry for minutes), unless the environment says otherwise."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(retries))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(timeout_s))


def metric_points(frame: pd.DataFrame) -> pd.DataFrame:
    """The events' :func:`~toolkit.runs.events.scalars` as MLflow keeps them: an infinity as
    the largest float of its sign (what MLflow's SQL store writes for it)."""
    points = scalars(frame)
    return points.assign(value=points["value"].clip(-sys.float_info.max, sys.float_info.max))


def log_points(client: MlflowClient, mlflow_id: str, points: pd.DataFrame) -> None:
    """Log :func:`metric_points` as MLflow metrics (wall time in ms; a record without one at
    0), in requests of at most MLflow's batch size."""
    walls = (points["wall"].fillna(0) * 1000).round().astype("int64")  # as _ms
    metrics = [
        Metric(name, float(value), int(wall), int(step))
        for name, value, wall, step in zip(
            points["name"], points["value"], walls, points["step"], strict=True
        )
    ]
    _log_batches(client, mlflow_id, metrics=metrics)


def set_status(client: MlflowClient, mlflow_id: str, status: dict) -> None:
    """The MLflow status of a lab ``status`` (:data:`STATUS`), an end at its ``finished``
    time, and its ``lab.state`` and ``lab.reason`` tags; nothing where MLflow says so
    already."""
    mlflow_status = STATUS.get(status.get("state"))
    logged = client.get_run(mlflow_id)
    info, tags = logged.info, logged.data.tags
    for key, value in ((STATE_TAG, status.get("state")), (REASON_TAG, status.get("reason"))):
        if value and tags.get(key) != str(value):
            client.set_tag(mlflow_id, key, str(value))
    if mlflow_status in TERMINAL:
        end = _ms(status.get("finished") or status.get("updated") or time.time())
        if (info.status, info.end_time) != (mlflow_status, end):
            client.set_terminated(mlflow_id, mlflow_status, end_time=end)
    elif mlflow_status is not None and info.status != mlflow_status:
        client.update_run(mlflow_id, status=mlflow_status)


def _ms(seconds: float) -> int:
    """A time in seconds as MLflow's milliseconds, the nearest."""
    return round(seconds * 1000)


def _params(run: RunDir) -> dict[str, str]:
    """The run's config, flattened, as MLflow params (none where it cannot be read)."""
    try:
        config = run.config()
    except (OSError, ConfigError):
        return {}
    return {k: "null" if v is None else str(v) for k, v in config.flat().items()}


def _missing(
    client: MlflowClient, logged: Run, points: pd.DataFrame, params: dict[str, str]
) -> pd.DataFrame | None:
    """The rows of ``points`` the MLflow run ``logged`` lacks, as multisets of (name, step,
    value); or ``None`` where it holds a point or a param value the run does not."""
    data, mlflow_id = logged.data, logged.info.run_id
    if any(params.get(key) != value for key, value in data.params.items()):
        return None
    histories = [
        pd.DataFrame(
            [(m.key, m.step, m.value) for m in client.get_metric_history(mlflow_id, name)],
            columns=_POINT,
        )
        for name in data.metrics
    ]
    logged = pd.concat(histories, ignore_index=True) if histories else pd.DataFrame(columns=_POINT)
    merged = _numbered(points).merge(
        _numbered(logged.astype({"step": "int64", "value": "float64"}))[[*_POINT, "n"]],
        on=[*_POINT, "n"],
        how="outer",
        indicator=True,
    )
    if (merged["_merge"] == "right_only").any():
        return None
    return merged[merged["_merge"] == "left_only"]


def _numbered(points: pd.DataFrame) -> pd.DataFrame:
    """``points`` with ``n``: the how-many-th equal (name, step, value) each is, so a merge
    on the four matches multisets."""
    return points.assign(n=points.groupby(_POINT, sort=False).cumcount())


def _tags(run: RunDir) -> dict[str, str]:
    """The run's tags for MLflow (see the module doc)."""
    status, meta = run.recorded_status(), run.meta()
    tags = {RUN_ID_TAG: run.run_id, TAGS_TAG: ", ".join(run.tags())}
    for tag in run.tags():
        key, _, value = (part.strip() for part in tag.partition(":"))
        if key and validate_param_and_metric_name(key):
            tags[key] = value
    for key, value in (
        (NOTE_TAG, meta.get("notes")),
        (STATE_TAG, status.get("state")),
        (REASON_TAG, status.get("reason")),
    ):
        if value:
            tags[key] = str(value)
    return tags


def _tag_keys(listed: str) -> set[str]:
    """The MLflow tag keys of a ``lab.tags`` value."""
    return {tag.partition(":")[0].strip() for tag in listed.split(",")} - {""}


def _log_artifacts(client: MlflowClient, mlflow_id: str, run: RunDir) -> None:
    for path in (run.config_path, run.meta_path):
        if path.is_file():
            client.log_artifact(mlflow_id, str(path))
    latest = checkpoints.latest(run.checkpoints_path)
    if latest is not None and (latest / checkpoints.MANIFEST).is_file():
        client.log_artifact(
            mlflow_id, str(latest / checkpoints.MANIFEST), f"checkpoints/{latest.name}"
        )


def _log_batches(
    client: MlflowClient,
    mlflow_id: str,
    metrics: list[Metric] = (),
    params: list[Param] = (),
    tags: list[RunTag] = (),
) -> None:
    """``log_batch`` in requests within MLflow's limits (metrics, params and tags each)."""
    for size, field, entities in (
        (MAX_METRICS_PER_BATCH, "metrics", metrics),
        (MAX_PARAMS_TAGS_PER_BATCH, "params", params),
        (MAX_PARAMS_TAGS_PER_BATCH, "tags", tags),
    ):
        for start in range(0, len(entities), size):
            client.log_batch(mlflow_id, **{field: entities[start : start + size]})
