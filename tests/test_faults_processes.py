"""Faults, class 3 and 4: the state of a run comes from what is actually alive (a killed
supervisor, a reused pid), stop ends every process of a run even without its supervisor, and a
full disk ends a run as ``failed`` with the cause while losing nothing already written. Real
horovodrun runs; the full disk is a small tmpfs (mounting needs root: skipped otherwise)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import run_cli
from test_train import SMALL, wait

from toolkit.config import from_mapping
from toolkit.files import WriteError, write_json
from toolkit.launching import launch as launcher
from toolkit.runs import processes
from toolkit.runs.events import EventWriter, read_events
from toolkit.runs.rundir import RunDir
from toolkit.terminal import runs_table

LONG = {**SMALL, "epochs": 200}


def records(run: RunDir, role: str) -> list[dict]:
    return [p for p in run.status().get("processes", []) if p["role"] == role]


def wait_for(predicate, timeout=180.0, message=""):
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, message
        time.sleep(0.1)


def test_a_killed_supervisor_leaves_a_truthful_state_and_stop_ends_every_process(tmp_path):
    run = launcher.launch(from_mapping(LONG), runs_root_dir=tmp_path, run_id="orphaned")
    wait_for(lambda: len(records(run, "worker")) == 2, message=run.stdout_path.read_text())
    (supervisor,) = records(run, "supervisor")
    tracked = [processes.find(p) for p in run.status()["processes"]]
    assert all(tracked) and len(tracked) == 4  # supervisor, horovodrun, 2 workers

    os.kill(supervisor["pid"], signal.SIGKILL)
    wait_for(lambda: processes.find(supervisor) is None)
    time.sleep(1)
    assert run.status()["state"] == "running"  # its workers are alive, so it is running
    assert " running " in runs_table(tmp_path)

    result = run_cli(["stop", "orphaned"], tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == "orphaned: stopped", result
    assert not [p for p in tracked[1:] if p.is_running() and p.status() != "zombie"]
    time.sleep(2)  # nothing is left to write another state
    status = run.status()
    assert status["state"] == "stopped"
    assert status["reason"].startswith("stopped on request from the CLI by "), status
    last = run.stdout_path.read_text().rstrip().splitlines()[-1]  # after horovodrun's traceback
    assert last.startswith("[lab ") and "stopped on request from the CLI" in last, last
    assert last.endswith("resume it with: python -m toolkit resume orphaned")


@pytest.mark.parametrize("stopper", ["this process", "another process"])
def test_stop_ends_a_run_trained_in_a_kernel_without_killing_it_or_its_children(stopper, tmp_path):
    """A run trained in this process (as in a notebook's kernel) stops itself; neither this
    process nor anything it started (here a sleep, as a kernel's other runs or tools) is
    signalled, whether the stop comes from here or from the CLI or the app."""
    from toolkit.train import train

    config = from_mapping({**LONG, "workers": 1, "logging": {"every_steps": 5}})
    thread = threading.Thread(target=train, args=(config, tmp_path / "here"), daemon=True)
    thread.start()
    run = RunDir(tmp_path / "here")
    wait_for(lambda: len(read_events(run.events_path)) >= 2)
    assert [p["pid"] for p in records(run, processes.IN_PROCESS)] == [os.getpid()]
    assert run.status()["state"] == "running"
    child = subprocess.Popen(["sleep", "120"])
    try:
        if stopper == "this process":
            launcher.stop(run)
        else:
            result = run_cli(["stop", "here"], tmp_path)
            assert result.returncode == 0, result.stderr
        thread.join(120)
        assert not thread.is_alive()  # it ended itself at its next check
        assert child.poll() is None  # this process's child lives on
    finally:
        child.kill()
        child.wait()
    status = run.status()
    door = "Python" if stopper == "this process" else "the CLI"
    assert status["state"] == "stopped"
    assert status["reason"].startswith(f"stopped on request from {door} by "), status
    stopped_at = read_events(run.events_path)["step"].max()
    assert stopped_at < run.meta()["total_steps"]
    if stopper == "this process":  # resumed here, it trains on: the old stop does not hold
        thread = threading.Thread(
            target=train, args=(config, tmp_path / "here"), kwargs={"resume": True}, daemon=True
        )
        thread.start()
        wait_for(lambda: read_events(run.events_path)["step"].max() > stopped_at + 20)
        status = run.status()
        assert status["state"] == "running" and not status["stop_requested"], status
        assert status["reason"] is None and status["finished"] is None, status
        launcher.stop(run)
        thread.join(120)
        assert not thread.is_alive() and run.status()["state"] == "stopped"


def test_a_reused_pid_is_not_mistaken_for_the_run(tmp_path):
    run = RunDir.create(tmp_path, "reused")
    me = processes.record("worker")
    run.set_status("running", processes=[{**me, "started": me["started"] - 3600}])
    assert run.status()["state"] == "failed"  # same pid, another process: the run is dead
    run.set_status("running", processes=[me], updated=0)
    assert run.status()["state"] == "running"  # the live process itself, long after start-up


def test_a_process_on_another_host_is_judged_by_its_heartbeat(tmp_path):
    """A remote record without a fresh heartbeat reads failed, not running for ever; reading
    never rewrites the stored status (a reader on another host has nothing else to go by)."""
    run = RunDir.create(tmp_path, "remote")
    elsewhere = {**processes.record("worker"), "host": "another-host", "pid": 2**22 + 1}
    run.set_status("running", processes=[elsewhere])
    assert run.status()["state"] == "failed"
    beat = processes.heartbeat_path(run.path, elsewhere)
    beat.parent.mkdir()
    beat.write_text("")
    assert run.status()["state"] == "running"
    old = time.time() - processes.HEARTBEAT_STALE_S - 1
    os.utime(beat, (old, old))
    assert run.status()["state"] == "failed"
    assert json.loads(run.status_path.read_text())["state"] == "running"


def test_training_asked_to_stop_never_claims_completed(tmp_path):
    run = RunDir.create(tmp_path, "late")
    run.set_status("running", stop_requested=True)
    run.set_status("completed", exit_code=0)  # what training writes as it finishes
    assert run.status()["state"] == "stopped"
    run.finish("failed", exit_code=1, reason="the supervisor's guess")  # the first final wins
    status = run.status()
    assert status["state"] == "stopped" and status["exit_code"] == 0
    assert status["reason"] == "stopped on request"


# --- A full disk --------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs, unmounted afterwards."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> None:
    """Fill ``disk`` to the last byte."""
    fd = os.open(disk / f"filler-{uuid.uuid4().hex}", os.O_WRONLY | os.O_CREAT)
    size = 1 << 20
    while size:
        try:
            os.write(fd, b"\0" * size)
        except OSError:
            size //= 2
    os.close(fd)


def hidden_temp_files(path: Path) -> list[Path]:
    return [p for p in path.rglob(".*") if ".tmp" in p.name or "creating" in p.name]


def test_status_and_events_on_a_full_disk(small_disk):
    run = RunDir.create(small_disk, "full")
    run.set_status("running", reason="x" * 200)  # a status with room to overwrite in place
    with EventWriter(run.events_path) as writer:
        writer.write({"step": 1, "phase": "train", "loss": 1.0})
        fill(small_disk)
        with pytest.raises(WriteError) as error:
            for step in range(2, 10_000):
                writer.write({"step": step, "phase": "train", "loss": 1.0, "pad": "y" * 500})
    assert str(error.value) == "no space left on device while writing events.jsonl"
    assert run.events_path.read_bytes().endswith(b"\n")  # the failed record was cut off whole
    written = run.events_path.read_bytes().count(b"\n")
    run.set_status("failed", reason=str(error.value))
    assert run.status()["state"] == "failed" and run.status()["reason"] == str(error.value)
    events = read_events(run.events_path)
    assert len(events) == written and events.step.tolist() == list(range(1, written + 1))
    assert hidden_temp_files(small_disk) == []
    with pytest.raises(WriteError, match="no space left on device while writing big.json"):
        write_json(small_disk / "big.json", {"x": "z" * 100_000})  # no old file to overwrite
    assert hidden_temp_files(small_disk) == []


def test_a_launch_onto_a_full_disk_exits_2_and_leaves_nothing(small_disk, subprocess_env):
    fill(small_disk)
    args = ["launch", "experiments/quickstart.yaml", "--name", "nope"]
    result = run_cli(args, small_disk / "runs", subprocess_env)
    assert result.returncode == 2, result.stderr
    assert "no space left on device" in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert not (small_disk / "runs").exists() or os.listdir(small_disk / "runs") == []


def test_a_run_that_fills_the_disk_ends_failed_with_the_cause(small_disk, subprocess_env):
    os.environ["PATH"] = subprocess_env["PATH"]
    run = launcher.launch(from_mapping(LONG), runs_root_dir=small_disk, run_id="filler")
    wait_for(lambda: len(read_events(run.events_path)) >= 3, message=run.stdout_path.read_text())
    fill(small_disk)
    status = wait(run)
    assert status["state"] == "failed", status
    assert status["reason"].startswith("no space left on device while writing "), status
    assert status["reason"].split()[-1] in ("events.jsonl", "checkpoints/epoch-0001")
    lines = run.events_path.read_bytes().splitlines(keepends=True)
    assert all(line.endswith(b"\n") and json.loads(line) for line in lines)  # nothing torn
    assert len(read_events(run.events_path)) == len(lines) >= 3
    assert hidden_temp_files(run.path) == []
    recorded = run.status()["processes"]
    wait_for(lambda: not any(map(processes.find, recorded)), 60, "a process of it hangs on")
