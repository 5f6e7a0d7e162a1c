"""A fourth place to run is one module and one registry line: a toy executor, written out here,
goes through every door that meets an executor (launch, the runs table's "where", stop, resume,
a sweep, failure reading), and the doors never ask which executor it is.

The toy runs a run's one worker as ``python -m toolkit.train`` itself, under the local
executor's queue and supervisor but without horovodrun: a different launcher, so failure
reading must name it. Cost: four short one-worker runs, ~30 s on 2 cores; the rest < 1 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from test_train import wait

from toolkit import files
from toolkit.config import ExperimentConfig, from_mapping
from toolkit.launching import launch as launcher
from toolkit.launching import supervisor, sweep_runner
from toolkit.launching.executors import registry
from toolkit.launching.executors.local import LocalExecutor
from toolkit.launching.sweep import from_mapping as sweep_from_mapping
from toolkit.runs import checkpoints, placement, processes
from toolkit.runs.rundir import RunDir
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


class ToyExecutor(LocalExecutor):
    """A run named ``toy*`` runs here: its one worker without horovodrun."""

    kind = "toy"
    launcher = "toy-worker"

    @classmethod
    def chosen_by(cls, config: ExperimentConfig) -> bool:
        return config.name.startswith("toy")

    def where(self, config: ExperimentConfig, job: str | None = None) -> str:
        return "the toy executor"

    def argv(self, config: ExperimentConfig, run: RunDir, resume: bool) -> list[str]:
        return supervisor.train_argv(run, resume)


@pytest.fixture
def toy(monkeypatch):
    """The toy registered: one line."""
    monkeypatch.setattr(registry, "EXECUTORS", [ToyExecutor, *registry.EXECUTORS])


def test_the_registry_asks_each_in_turn_and_the_last_takes_any_config():
    local = from_mapping({**TOY, "name": "plain"})
    slurm = from_mapping({**TOY, "name": "plain", "slurm": {"time": "0:10:00"}})
    elastic = {"min_workers": 1, "max_workers": 2, "discovery": "hosts.txt"}
    hosts = from_mapping(
        {**TOY, "name": "plain", "workers": 2, "batch": {"global_size": 128}, "elastic": elastic}
    )
    assert [registry.choose(c).kind for c in (local, slurm, hosts)] == ["local", "slurm", "hosts"]
    assert registry.choose(from_mapping(TOY)).kind == "local"  # not registered here


def test_a_toy_executor_goes_through_every_door(toy, runs):
    run = launcher.launch(from_mapping({**TOY, "epochs": 500}), runs_root_dir=runs)
    status = run.recorded_status()
    assert (status["executor"], status["where"], status["launcher"]) == (
        "toy",
        "the toy executor",
        "toy-worker",
    )
    assert "horovodrun" not in " ".join(run.meta()["command"])
    wait(run, states=("running",))
    while checkpoints.latest(run.checkpoints_path) is None:
        time.sleep(0.2)
    launcher.stop(run, runs, by="the toy test")
    assert run.status()["state"] == "stopped"
    assert summary(run)["where"] == "the toy executor"

    launcher.resume(run, runs)
    assert wait(run, states=("running",))["executor"] == "toy"
    assert run.meta()["command"][-1] == "--resume"
    launcher.stop(run, runs, by="the toy test")
    assert run.status()["state"] == "stopped"

    broken = launcher.launch(
        from_mapping({**TOY, "name": "toy-killed", "epochs": 500}), runs_root_dir=runs
    )
    wait(broken, states=("running",))
    processes = broken.recorded_status()["processes"]
    worker = next(p for p in processes if p["role"] != "supervisor")  # it records itself
    os.kill(worker["pid"], signal.SIGKILL)
    failed = wait(broken)
    assert failed["state"] == "failed"
    assert "toy-worker exited with code -9" in failed["reason"], failed["reason"]


def test_a_sweep_of_toy_runs_goes_to_the_toy_executor(toy, runs):
    sweep = sweep_from_mapping(
        {"name": "toys", "base": {**TOY, "epochs": 1}, "grid": {"batch.per_worker": [32, 64]}}
    )
    table = sweep_runner.run(sweep, runs, max_parallel=2, log=lambda _: None, poll_s=0.2)
    assert list(table["state"]) == ["completed", "completed"]
    for run_id in table["run_id"]:
        status = RunDir(runs / run_id).recorded_status()
        assert status["executor"] == "toy" and placement.where(status) == "the toy executor"


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
