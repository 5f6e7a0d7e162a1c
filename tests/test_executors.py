"""A new place to run is one module and one registry line: ``tests/toyq.py``, a toy
*scheduler-backed* executor (a batch queue faked by a table of jobs and a job runner per job),
loaded as a plugin and taken through every door that meets an executor, from the CLI and the
Launch page: launch, the runs table (its queue's state and reason), stop, resume, a failure in
its own words, a sweep and a search; the doors never name it. Cost: seven short one-worker
runs, ~60 s on 2 cores; the rest < 1 s.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml
from conftest import ROOT, run_cli
from test_app import by_label, launch_page
from test_train import wait

from toolkit import files, plugins
from toolkit.config import from_mapping
from toolkit.launching import launch as launcher
from toolkit.launching.executors import registry
from toolkit.runs import placement, processes
from toolkit.runs.rundir import RunDir, list_runs
from toolkit.runs.states import State
from toolkit.runs.table import summary
from toolkit.terminal import runs_table

TOY = {
    "name": "toy",
    "dataset": {"name": "mnist1d", "params": {"num_samples": 800}},
    "model": {"name": "mlp"},
    "batch": {"per_worker": 64},
    "epochs": 4,
    "workers": 1,
    "checkpoint": {"every_epochs": 1},
}


@pytest.fixture
def toyq_here(monkeypatch):
    """The toy registered in this process, as a plugin's import registers it (its one line),
    for the test's own reads of its runs; undone after the test."""
    monkeypatch.setattr(registry, "EXECUTORS", list(registry.EXECUTORS))
    monkeypatch.setattr(placement, "SCHEDULERS", dict(placement.SCHEDULERS))
    monkeypatch.setattr(plugins, "SECTIONS", dict(plugins.SECTIONS))
    monkeypatch.syspath_prepend(str(ROOT / "tests"))
    import toyq

    registry.register(toyq.ToyqExecutor)  # a second import would not run its line again


@pytest.fixture
def toyq_env(subprocess_env, toyq_here):
    """Every process the CLI starts loads the toy as a plugin: ``LBL_EXECUTORS=toyq``."""
    tests = str(ROOT / "tests")
    return {**subprocess_env, "LBL_EXECUTORS": "toyq", "PYTHONPATH": f"{ROOT}{os.pathsep}{tests}"}


def toy_cli(args: list[str], runs, env: dict) -> subprocess.CompletedProcess:
    done = run_cli(args, runs, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_the_toy_is_one_module_and_no_door_names_it():
    """The files the toy touched: one, ``tests/toyq.py`` (its registry line included); no file
    of the toolkit or the app names it (this test's file drives it)."""
    sources = [*(ROOT / "toolkit").rglob("*.py"), *(ROOT / "app").rglob("*.py")]
    naming = sorted(
        path.relative_to(ROOT).as_posix()
        for path in [*sources, *(ROOT / "tests").glob("*.py")]
        if "toyq" in path.read_text()
    )
    assert naming == ["tests/test_executors.py", "tests/toyq.py"]
    assert (
        (ROOT / "tests" / "toyq.py")
        .read_text()
        .rstrip()
        .endswith("registry.register(ToyqExecutor)")
    )


def test_the_registry_asks_each_in_turn_and_the_last_takes_any_config():
    local = from_mapping({**TOY, "name": "plain"})
    slurm = from_mapping({**TOY, "name": "plain", "slurm": {"time": "0:10:00"}})
    elastic = {"min_workers": 1, "max_workers": 2, "discovery": "hosts.txt"}
    hosts = from_mapping(
        {**TOY, "name": "plain", "workers": 2, "batch": {"global_size": 128}, "elastic": elastic}
    )
    assert [registry.choose(c).kind for c in (local, slurm, hosts)] == ["local", "slurm", "hosts"]
    assert registry.choose(from_mapping(TOY)).kind == "local"  # not registered here


def test_a_scheduler_backed_toy_goes_through_every_door_from_the_cli(toyq_env, runs, tmp_path):
    config = tmp_path / "toy.yaml"
    config.write_text(yaml.safe_dump({**TOY, "epochs": 500}))
    toy_cli(["launch", str(config), "--toyq", "--toyq-hold", "3"], runs, toyq_env)
    (run,) = list_runs(runs)
    queued = run.status()  # the queue's word: its state and reason while the job waits
    assert queued["state"] == "queued" and queued["executor"] == "toyq", queued
    assert queued["reason"] == "waiting in toyq queue main (job 1)"
    table = toy_cli(["runs"], runs, toyq_env).stdout
    assert "toyq job 1" in table and "waiting in toyq queue main" in table
    assert run.config().section("toyq").hold_s == 3  # the flag, in the run's own config
    wait(run, states=("running",))
    while not list(run.checkpoints_path.glob("epoch-*")):
        assert run.status()["state"] == "running"
    toy_cli(["stop", run.run_id], runs, toyq_env)
    assert run.status()["state"] == "stopped"
    assert "toyq: job 1 cancelled on request" in run.stdout_path.read_text()

    toy_cli(["resume", run.run_id], runs, toyq_env)
    assert run.recorded_status()["where"] == "toyq job 2"
    wait(run, states=("running",))
    assert run.status()["resumed_from"].startswith("epoch-")
    toy_cli(["stop", run.run_id], runs, toyq_env)

    config.write_text(yaml.safe_dump({**TOY, "name": "toy-cancelled", "epochs": 500}))
    toy_cli(["launch", str(config), "--toyq"], runs, toyq_env)
    cancelled = RunDir(runs / next(r.run_id for r in list_runs(runs) if r.run_id != run.run_id))
    wait(cancelled, states=("running",))
    table_path = runs / ".toyq" / "jobs.json"
    operator = ["python", "-m", "toyq", "cancel", str(table_path), "3", "for maintenance"]
    subprocess.run(operator, env=toyq_env, check=True, cwd=ROOT / "tests")
    failed = wait(cancelled)
    assert failed["state"] == "failed", failed
    assert failed["reason"].startswith("toyq cancelled job 3 for maintenance; resume the run")
    assert summary(cancelled)["where"] == "toyq job 3"


def test_a_sweep_and_a_search_go_to_the_toy_queue(toyq_env, runs, tmp_path):
    """Their runs, all submitted at once (the toy's queue paces them), from the CLI's flag."""
    base = {**TOY, "epochs": 1}
    sweep = {"name": "toys", "base": base, "grid": {"batch.per_worker": [32, 64]}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep))
    toy_cli(["sweep", str(tmp_path / "s.yaml"), "--toyq"], runs, toyq_env)
    space = {"optimizer.learning_rate": {"low": 0.01, "high": 0.1}}
    search = {"name": "toyq-s", "base": base, "space": space, "trials": 2, "pruner": "none"}
    (tmp_path / "q.yaml").write_text(yaml.safe_dump(search))
    said = toy_cli(["search", str(tmp_path / "q.yaml"), "--toyq"], runs, toyq_env).stdout
    assert "search toyq-s done: 2 trials, 2 completed" in said
    ran = list_runs(runs)
    assert len(ran) == 4 and {r.status()["state"] for r in ran} == {"completed"}
    for run in ran:
        status = run.recorded_status()
        assert status["executor"] == "toyq" and placement.where(status).startswith("toyq job ")


def test_the_launch_page_offers_the_toy_queue_and_its_fields(runs, toyq_here):
    """The toy registered in this process: the Launch page's "Where" lists it, its section's
    fields are a form, and a launch goes to its queue."""
    at = launch_page()
    by_label(at.radio, "Where").set_value("Toy queue").run()
    assert by_label(at.text_input, "Queue").value == "main"
    by_label(at.number_input, "Hold s").set_value(30.0).run()
    assert not at.error, [e.value for e in at.error]
    by_label(at.button, "Launch").click().run()
    assert not at.exception, at.exception
    (run,) = list_runs(runs)
    assert run.config().section("toyq").hold_s == 30.0
    status = run.status()
    assert (status["state"], status["executor"]) == ("queued", "toyq"), status
    launcher.stop(run, runs)  # in its queue still: cancelled before it starts
    assert run.status()["state"] == "stopped"


def test_a_status_written_before_executors_reads_as_it_did(tmp_path):
    """Statuses as the code before executors wrote them (no executor, where or launcher)."""
    on_slurm = from_mapping({**TOY, "name": "plain", "slurm": {"time": "0:10:00"}})
    run = RunDir.create(tmp_path, "on-slurm", on_slurm)
    files.write_json(run.status_path, {"state": "completed", "slurm_job_id": "12", "updated": 1.0})
    status = run.status()
    assert status["state"] == State.COMPLETED and status["state"] == "completed"
    assert (placement.where(status), placement.launcher(status)) == ("Slurm job 12", "srun")
    assert registry.of_run(run, status).kind == "slurm"
    assert summary(run)["where"] == "Slurm job 12"

    here = RunDir.create(tmp_path, "here", from_mapping({**TOY, "name": "plain"}))
    record = processes.record("supervisor", os.getpid())
    files.write_json(here.status_path, {"state": "stopped", "processes": [record], "updated": 1.0})
    status = here.status()
    assert (placement.where(status), placement.launcher(status)) == ("this machine", "horovodrun")
    assert registry.of_run(here, status).kind == "local"


def test_an_end_only_a_reader_can_tell_is_recorded_where_the_others_are(tmp_path):
    """A live run whose processes are gone (its supervisor killed with the rest) gets its end
    and reason in ``status.json`` from ``settle``, which the runs table calls."""
    run = RunDir.create(tmp_path, "orphan", from_mapping({**TOY, "name": "plain"}))
    gone = subprocess.Popen(["true"])
    gone.wait()
    record = {**processes.record("supervisor"), "pid": gone.pid}  # as it was, now gone
    files.write_json(run.status_path, {"state": "running", "processes": [record], "updated": 1.0})
    assert run.recorded_status()["state"] == "running"  # a reader derives the end, and writes none
    assert run.status()["state"] == State.FAILED
    assert "orphan" in runs_table(str(tmp_path))
    recorded = run.recorded_status()
    assert recorded["state"] == "failed" and recorded["finished"] is not None
    assert recorded["reason"] == "its processes exited without writing a final status"
