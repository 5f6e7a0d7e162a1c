"""Runs in MLflow (``toolkit.runs.mlflow_export`` and ``mlflow_live``), against a real
``mlflow server`` started here on 127.0.0.1 (SQLite, a temporary artifact root).

The oracle for metrics is ``events.jsonl`` read line by line with ``json``
(:func:`test_tensorboard.from_jsonl`, TensorBoard's export's oracle: the same names), for params
``config.yaml`` read with ``yaml`` and flattened here; the other side is what ``MlflowClient``
reads back from the server. Cost: two servers (about 7 s each to start), one in-process
quickstart of 2 epochs (about 10 s) and one launched run, stopped once it has trained on past
the server's death (about 45 s).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml
from conftest import ROOT, dashboard, free_port, run_cli, serving
from mlflow import MlflowClient
from test_tensorboard import from_jsonl

from toolkit.config import from_mapping
from toolkit.launching import launch as launcher
from toolkit.runs import mlflow_export, mlflow_live
from toolkit.runs.events import EventTail, EventWriter, truncate_after
from toolkit.runs.rundir import RunDir
from toolkit.runs.states import LIVE, State
from toolkit.sections import MlflowConfig

QUICKSTART = yaml.safe_load((ROOT / "experiments" / "quickstart.yaml").read_text())
LIVE_EXPERIMENT = "live"


class Server:
    """A real ``mlflow server`` (its own process group: the server and its uvicorn)."""

    def __init__(self, home, port: int | None = None):
        self.home, self.port = home, port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            str(ROOT / ".venv" / "bin" / "mlflow") if (ROOT / ".venv").exists() else "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{self.home / 'mlflow.db'}",
            "--artifacts-destination",
            str(self.home / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]

    def serve(self):
        def ready() -> bool:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                return answer.status == 200

        self.home.mkdir(parents=True, exist_ok=True)
        return serving(
            self.command(),
            log_path=self.home / f"server-{time.time_ns()}.log",
            ready=ready,
            timeout_s=90,
            start_new_session=True,
        )

    def kill(self, process: subprocess.Popen) -> None:
        """SIGKILL to the server and its workers."""
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("mlflow"))
    with server.serve() as process:
        yield server
        os.killpg(process.pid, signal.SIGTERM)


@pytest.fixture(scope="module")
def trained(server, tmp_path_factory) -> RunDir:
    """A quickstart of 2 epochs on 1 worker, trained in this process, mirrored live to the
    server's experiment ``live``; tagged and noted after."""
    from toolkit.train import train

    config = {**QUICKSTART, "epochs": 2, "workers": 1}
    config["logging"] = {
        **config["logging"],
        "mlflow": {"tracking_uri": server.uri, "experiment": LIVE_EXPERIMENT},
    }
    run = train(from_mapping(config), runs_root=tmp_path_factory.mktemp("runs"), verbose=0)
    run.set_tags(add=["search:quick", "trial:3", "demo"])
    run.set_notes("the lab's note")
    return run


COPIES = itertools.count(1)


@pytest.fixture
def run(trained, tmp_path) -> RunDir:
    """A copy of the trained run that a test may change, under an id of its own (a run is
    found in the store by its id, wherever it was exported)."""
    copy = tmp_path / "runs" / f"{trained.run_id}-copy{next(COPIES)}"
    shutil.copytree(trained.path, copy, ignore=shutil.ignore_patterns(".mlflow"))
    copied = RunDir(copy)
    copied.update_meta(run_id=copied.run_id)
    return copied


def mlflow_run(client: MlflowClient, experiment: str, run_id: str):
    """The one active MLflow run of lab run ``run_id`` in ``experiment``."""
    found = client.search_runs(
        [client.get_experiment_by_name(experiment).experiment_id],
        filter_string=f"tags.`lab.run_id` = '{run_id}'",
    )
    assert len(found) == 1, [r.info.run_name for r in found]
    return found[0]


def histories(client: MlflowClient, mlflow_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every metric's full history, as (step, value), in step order (a sort that keeps the
    order of equal steps the events give)."""
    names = client.get_run(mlflow_id).data.metrics
    return {
        name: sorted((m.step, m.value) for m in client.get_metric_history(mlflow_id, name))
        for name in names
    }


def events_by_step(run: RunDir) -> dict[str, list[tuple[int, float]]]:
    return {name: sorted(points) for name, points in from_jsonl(run.events_path).items()}


def flat_config(run: RunDir) -> dict[str, str]:
    """``config.yaml`` flattened to dotted paths here (an empty section has no field; a list
    is JSON), each value as MLflow keeps params: text."""
    out = {}

    def walk(node, prefix):
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            elif value is None or isinstance(value, list):
                out[f"{prefix}{key}"] = json.dumps(value)
            else:
                out[f"{prefix}{key}"] = str(value)

    walk(yaml.safe_load(run.config_path.read_text()), "")
    return out


def test_a_live_run_is_in_mlflow_as_its_events_say(trained, server):
    client = MlflowClient(server.uri)
    logged = mlflow_run(client, LIVE_EXPERIMENT, trained.run_id)
    assert logged.info.run_name == trained.run_id
    assert logged.info.status == "FINISHED"
    assert logged.data.tags["lab.state"] == "completed"  # its end, not the first round's state
    assert histories(client, logged.info.run_id) == events_by_step(trained)
    assert {"train/loss", "eval/accuracy", "trust_ratio/conv1/kernel", "epoch"} <= set(
        logged.data.metrics
    )
    assert logged.data.params == flat_config(trained)


def test_an_export_after_the_live_mirror_adds_no_point_and_brings_the_labels(
    trained, server, tmp_path
):
    """Exported without naming the experiment the mirror used, the run is found there (by
    its ``lab.run_id``): no second MLflow run in the experiment the config would give."""
    client = MlflowClient(server.uri)
    before = histories(client, mlflow_run(client, LIVE_EXPERIMENT, trained.run_id).info.run_id)
    argv = ["export", "mlflow", trained.run_id, "--tracking-uri", server.uri]
    out = run_cli(argv, trained.path.parent)
    said = f"{trained.run_id}: 0 new metric points -> MLflow run "
    assert said in out.stdout and f"in experiment {LIVE_EXPERIMENT!r}" in out.stdout, (
        out.stdout + out.stderr
    )
    assert client.get_experiment_by_name(QUICKSTART["name"]) is None  # the config's name
    logged = mlflow_run(client, LIVE_EXPERIMENT, trained.run_id)
    assert histories(client, logged.info.run_id) == before
    tags = logged.data.tags
    assert tags["search"] == "quick" and tags["trial"] == "3" and tags["demo"] == ""
    assert tags["lab.tags"] == "demo, search:quick, trial:3"
    assert tags["mlflow.note.content"] == "the lab's note"
    assert tags["lab.state"] == "completed"


def test_an_export_gives_every_metric_param_tag_and_artifact_once(run, server, tmp_path):
    client = MlflowClient(server.uri)
    experiment = f"exported-{tmp_path.name}"
    argv = [
        "export",
        "mlflow",
        run.run_id,
        "--tracking-uri",
        server.uri,
        "--experiment",
        experiment,
    ]
    first = run_cli(argv, run.path.parent)
    want = events_by_step(run)
    points = sum(len(p) for p in want.values())
    assert f"{run.run_id}: {points:,} new metric points" in first.stdout, (
        first.stdout + first.stderr
    )
    logged = mlflow_run(client, experiment, run.run_id)
    assert histories(client, logged.info.run_id) == want
    assert logged.data.params == flat_config(run)
    assert logged.info.status == "FINISHED"
    assert logged.info.start_time == round(run.status()["started"] * 1000)
    assert logged.info.end_time == round(run.status()["finished"] * 1000)
    # artifacts: the files themselves, and the latest checkpoint's manifest
    got = tmp_path / "artifacts"
    client.download_artifacts(logged.info.run_id, "", str(got))
    assert (got / "config.yaml").read_bytes() == run.config_path.read_bytes()
    assert json.loads((got / "meta.json").read_text()) == run.meta()
    (checkpoint,) = sorted(run.checkpoints_path.glob("epoch-*"))[-1:]
    manifest = got / "checkpoints" / checkpoint.name / "manifest.json"
    assert manifest.read_bytes() == (checkpoint / "manifest.json").read_bytes()
    # a second export: the same MLflow run, nothing added
    second = run_cli(argv, run.path.parent)
    assert f"{run.run_id}: 0 new metric points" in second.stdout
    assert mlflow_run(client, experiment, run.run_id).info.run_id == logged.info.run_id
    assert histories(client, logged.info.run_id) == want


def test_a_search_or_a_sweep_is_one_experiment(run):
    """A trial's or a cell's run goes to its search's or sweep's experiment by default, not
    one experiment per trial (their config names differ); a name given wins."""
    run.update_meta(search="qs-tpe", trial=3)
    said = mlflow_export.export_runs([run], root=run.path.parent)
    assert "in experiment 'qs-tpe'" in said[0], said
    other = RunDir(shutil.copytree(run.path, run.path.with_name("cell")))
    other.update_meta(search=None, sweep="study-v2", cell="lars-1024")
    named = mlflow_export.Destination(root=run.path.parent).experiment_name
    assert named(other) == "study-v2"
    assert mlflow_export.Destination(experiment="mine").experiment_name(other) == "mine"


def test_a_run_exported_while_it_grows_gets_the_rest_later_in_the_local_store(run):
    whole = run.events_path.read_bytes()
    lines = whole.splitlines(keepends=True)
    run.events_path.write_bytes(b"".join(lines[: len(lines) // 2]))
    destination = mlflow_export.Destination(root=run.path.parent)  # the default: SQLite
    assert destination.tracking_uri.startswith("sqlite:///")
    assert (run.path.parent / ".mlflow" / "mlflow.db").parent.is_dir()
    first = mlflow_export.export(run, destination)
    client = MlflowClient(destination.tracking_uri)
    assert histories(client, first.mlflow_run_id) == events_by_step(run)
    run.events_path.write_bytes(whole)
    with EventWriter(run.events_path) as writer:  # and one more, an infinity among it
        writer.write({"step": 10**6, "phase": "eval", "loss": float("inf"), "accuracy": 0.5})
    second = mlflow_export.export(run, destination)
    assert second.mlflow_run_id == first.mlflow_run_id and not second.replaced
    assert second.points == sum(len(p) for p in events_by_step(run).values()) - first.points
    got = histories(client, first.mlflow_run_id)
    assert got["eval/loss"][-1] == (10**6, sys.float_info.max)  # MLflow's infinity
    got["eval/loss"][-1] = (10**6, float("inf"))
    assert got == events_by_step(run)
    assert mlflow_export.export(run, destination).points == 0
    artifacts = run.path.parent / ".mlflow" / "artifacts" / run.config().name
    assert list(artifacts.glob(f"{first.mlflow_run_id}/artifacts/config.yaml"))


def test_the_live_mirror_logs_each_point_once_across_its_reads(run):
    """A read that ends inside a step (its train record read, its system record not yet):
    the step's epoch is not logged twice. Against the local store, no server."""
    lines = run.events_path.read_bytes().splitlines(keepends=True)
    records = [json.loads(line) for line in lines]
    cut = next(  # between two records of one step, each with its epoch
        i
        for i in range(1, len(records))
        if records[i - 1]["step"] == records[i]["step"]
        and "epoch" in records[i - 1]
        and "epoch" in records[i]
    )
    records[cut]["wall"] += 1.0  # written a second later (MLflow keeps one of equal points)
    lines[cut] = json.dumps(records[cut]).encode() + b"\n"
    run.events_path.write_bytes(b"".join(lines[:cut]))
    mirror = mlflow_live.LiveMirror(run, MlflowConfig(experiment="mirror"), every_s=0.2).start()
    client = MlflowClient(mlflow_export.default_tracking_uri(run.path.parent))
    deadline = time.time() + 60
    while not _logged(client, "mirror", run, "epoch"):
        assert time.time() < deadline and not mirror.warned
        time.sleep(0.2)
    with open(run.events_path, "ab") as log:
        log.write(b"".join(lines[cut:]))
    mirror.close(State.COMPLETED)
    assert not mirror.warned
    logged = mlflow_run(client, "mirror", run.run_id)
    assert histories(client, logged.info.run_id) == events_by_step(run)
    assert logged.info.status == "FINISHED"


def test_a_rewound_log_replaces_the_mlflow_run_and_dropped_labels_go(run, server, tmp_path):
    destination = mlflow_export.Destination(server.uri, f"rewound-{tmp_path.name}")
    first = mlflow_export.export(run, destination)
    truncate_after(run.events_path, 10)  # a resumed run's log, trained again differently
    with EventWriter(run.events_path) as writer:
        writer.write({"step": 11, "phase": "train", "loss": 0.5})
        writer.write({"step": 12, "phase": "train", "loss": 0.25})
    run.set_tags(remove=["demo", "trial:3"])
    run.set_notes("")
    second = mlflow_export.export(run, destination)
    assert second.replaced and second.mlflow_run_id != first.mlflow_run_id
    client = MlflowClient(server.uri)
    assert client.get_run(first.mlflow_run_id).info.lifecycle_stage == "deleted"
    logged = mlflow_run(client, destination.experiment, run.run_id)
    assert histories(client, logged.info.run_id) == events_by_step(run)
    assert "demo" not in logged.data.tags and "trial" not in logged.data.tags
    assert "mlflow.note.content" not in logged.data.tags and logged.data.tags["search"] == "quick"


def test_an_unreachable_server_or_a_bad_uri_is_one_line_and_exit_2(run):
    closed = f"http://127.0.0.1:{free_port()}"
    began = time.monotonic()
    out = run_cli(["export", "mlflow", run.run_id, "--tracking-uri", closed], run.path.parent)
    assert out.returncode == 2 and out.stderr.startswith(f"error: MLflow at {closed}: ")
    assert time.monotonic() - began < 30
    out = run_cli(["export", "mlflow", "--tracking-uri", "ftp://x"], run.path.parent)
    assert out.returncode == 2 and "tracking_uri: must be an MLflow server" in out.stderr
    bad = {**QUICKSTART, "logging": {"mlflow": {"tracking_uri": "mlruns"}}}
    with pytest.raises(ValueError, match=r"logging\.mlflow\.tracking_uri: must be"):
        from_mapping(bad)


def test_the_runs_page_exports_the_selected_run(run, server, tmp_path, monkeypatch):
    monkeypatch.setenv("LBL_RUNS", str(run.path.parent))
    at = dashboard().run()
    assert not at.exception, at.exception
    (uri,) = [w for w in at.text_input if w.label == "Tracking URI"]
    (experiment,) = [w for w in at.text_input if w.label == "Experiment"]
    uri.set_value(server.uri)
    experiment.set_value(f"page-{tmp_path.name}").run()
    (button,) = [b for b in at.button if b.label == "Export this run"]
    button.click().run()
    assert not at.exception, at.exception
    assert f"exported 1 run to {server.uri}" in at.success[0].value.replace("\\", "")
    client = MlflowClient(server.uri)
    logged = mlflow_run(client, f"page-{tmp_path.name}", run.run_id)
    assert histories(client, logged.info.run_id) == events_by_step(run)
    (uri,) = [w for w in at.text_input if w.label == "Tracking URI"]
    uri.set_value("not a uri").run()
    (button,) = [b for b in at.button if b.label == "Export this run"]
    button.click().run()
    assert "tracking_uri: must be an MLflow server" in at.error[0].value.replace("\\", "")


@pytest.mark.timeout(240)
def test_a_server_killed_mid_run_stops_nothing_and_an_export_fills_the_gaps(tmp_path, runs):
    server = Server(tmp_path / "mlflow")
    config = {**QUICKSTART, "epochs": 2000, "workers": 1}  # ended by a stop, not by its epochs
    config["logging"] = {**config["logging"], "mlflow": {"tracking_uri": server.uri}}
    with server.serve() as process:
        run = launcher.launch(from_mapping(config), runs_root_dir=runs)
        client = MlflowClient(server.uri)
        _wait(run, lambda: _logged(client, "quickstart", run, "eval/accuracy"))
        server.kill(process)
    killed_at = _evaluations(run)
    _wait(run, lambda: "warning: MLflow" in run.stdout_path.read_text(errors="replace"))
    _wait(run, lambda: _evaluations(run) >= killed_at + 3)  # training goes on
    launcher.stop(run, by="the test")
    log = run.stdout_path.read_text(errors="replace")
    assert log.count("warning: MLflow") == 1, log
    (hint,) = re.findall(r"`(python -m toolkit [^`]+)` catches MLflow up", log)
    with server.serve():  # the same store, back up: the export fills what the mirror missed
        client = MlflowClient(server.uri)
        logged = mlflow_run(client, "quickstart", run.run_id)
        missed = sum(len(p) for p in events_by_step(run).values()) - sum(
            len(p) for p in histories(client, logged.info.run_id).values()
        )
        assert missed > 0
        # the command as the warning printed it, from another directory
        command = [sys.executable, *shlex.split(hint)[1:]]
        out = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert f"{run.run_id}: {missed:,} new metric points" in out.stdout, out.stdout + out.stderr
        assert histories(client, logged.info.run_id) == events_by_step(run)
        assert client.get_run(logged.info.run_id).info.status == "KILLED"  # stopped


def _wait(run: RunDir, done, timeout_s: float = 120) -> None:
    """Poll ``done()`` while ``run`` is live; fail if it ends first or ``timeout_s`` passes."""
    deadline = time.time() + timeout_s
    while not done():
        assert run.status()["state"] in LIVE, run.status()
        assert time.time() < deadline, f"not within {timeout_s} s: {run.status()}"
        time.sleep(0.5)


def _evaluations(run: RunDir) -> int:
    """How many evaluation records the run has on disk (a torn last line skipped)."""
    frame = EventTail(run.events_path).read_new()
    return int(frame["phase"].eq("eval").sum()) if "phase" in frame else 0


def _logged(client: MlflowClient, experiment: str, run: RunDir, metric: str) -> bool:
    """Whether ``run``'s MLflow run in ``experiment`` has a point of ``metric`` yet."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return False
    found = client.search_runs([found.experiment_id], f"tags.`lab.run_id` = '{run.run_id}'")
    return bool(found and found[0].data.metrics.get(metric) is not None)
