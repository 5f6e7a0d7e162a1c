"""The launch queue (toolkit.launching.slots): slots taken in order, never more than the capacity,
not even by processes racing for the last slot; stale entries dropped; impossible runs refused."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
from conftest import dashboard, run_cli
from test_train import SMALL, wait

from toolkit.config import from_mapping
from toolkit.launching import launch as launcher
from toolkit.launching import slots
from toolkit.runs.rundir import RunDir, RunError

RACERS = 8
RACER = Path(__file__).parent / "workers" / "queue_racer.py"


def _queued_run(root, name: str) -> RunDir:
    """A queued run with no process yet: live for rundir.STARTUP_GRACE_S."""
    return RunDir.create(root, name)


def test_racing_processes_never_hold_more_slots_than_the_capacity(tmp_path, subprocess_env):
    """8 processes (tests/workers/queue_racer.py) each take, hold and give back one of 2 slots,
    10 times, all starting at the same instant: every request is granted, in turn, and at no
    instant do more than 2 hold a slot. (With the queue's lock removed, concurrent
    read-modify-writes lose entries and grants, and this fails.)"""
    slots.set_capacity("localhost:2", tmp_path)
    names = [f"racer{i}" for i in range(RACERS)]
    for name in names:
        _queued_run(tmp_path, name)
    start_at = time.time() + 3  # after every racer has imported the toolkit
    reports_dir = tmp_path.parent / f"{tmp_path.name}-reports"
    reports_dir.mkdir()
    racers = [
        subprocess.Popen(
            [sys.executable, RACER, tmp_path, name, str(start_at), reports_dir / name],
            env=subprocess_env,
        )
        for name in names
    ]
    assert [racer.wait(timeout=120) for racer in racers] == [0] * RACERS
    reports = [
        json.loads(line) for n in names for line in (reports_dir / n).read_text().splitlines()
    ]
    assert [granted for _, granted, _, _ in reports] == [True] * len(reports)
    assert sorted(n for n, *_ in reports) == sorted(names * 10)  # every cycle of every racer
    edges = sorted([(t, 1) for *_, t, _ in reports] + [(t, -1) for *_, t in reports])
    holding = peak = 0
    for _, change in edges:
        holding += change
        peak = max(peak, holding)
    assert peak <= 2
    assert slots.entries(tmp_path) == []


def test_runs_start_in_the_order_they_were_queued(tmp_path):
    slots.set_capacity("localhost:2", tmp_path)
    a, b, c = (_queued_run(tmp_path, n) for n in ("a", "b", "c"))
    assert slots.enqueue(a, {"localhost": 2}) is True  # nobody waits and it fits: at once
    assert slots.enqueue(b, {"localhost": 2}) is False
    assert slots.enqueue(c, {"localhost": 1}) is False
    assert slots.try_start(b) is False  # a was first
    assert slots.try_start(a) is True
    assert slots.try_start(c) is False  # no overtaking b, though one slot... none free anyway
    assert slots.positions(tmp_path) == {"b": 1, "c": 2}
    a.finish("completed", released=time.time())  # it gave its slots back
    assert slots.try_start(c) is False  # b is next in line
    assert slots.try_start(b) is True
    assert slots.positions(tmp_path) == {"c": 1}


def test_a_first_run_too_big_for_the_free_slots_holds_back_smaller_later_ones(tmp_path):
    slots.set_capacity("localhost:3", tmp_path)
    big, small, later = (_queued_run(tmp_path, n) for n in ("big", "small", "later"))
    slots.enqueue(small, {"localhost": 2})
    assert slots.try_start(small) is True
    slots.enqueue(big, {"localhost": 2})
    slots.enqueue(later, {"localhost": 1})
    assert slots.try_start(big) is False and slots.try_start(later) is False
    assert [e["run_id"] for e in slots.entries(tmp_path)] == ["small", "big", "later"]


def test_ended_deleted_and_dead_runs_give_their_slots_back(tmp_path):
    slots.set_capacity("localhost:1", tmp_path)
    ended, deleted, dead, waiting = (
        _queued_run(tmp_path, n) for n in ("ended", "deleted", "dead", "waiting")
    )
    for run in (ended, deleted, dead, waiting):
        slots.enqueue(run, {"localhost": 1})
    assert slots.try_start(ended) is True
    ended.finish("completed")  # its supervisor died before releasing
    assert slots.try_start(deleted) is True
    shutil.rmtree(deleted.path)
    assert slots.try_start(dead) is True
    # its only process is gone (a record no live process matches): the run reads as failed
    gone = {"role": "supervisor", "pid": 2**22 + 7, "started": 1.0, "host": socket.gethostname()}
    dead.set_status("running", processes=[gone])
    assert slots.try_start(waiting) is True
    assert [e["run_id"] for e in slots.entries(tmp_path)] == ["waiting"]
    assert slots.try_start(ended) is None  # no longer queued


def test_capacity_defaults_to_this_machine_and_can_be_set(tmp_path):
    assert slots.capacity(tmp_path) == {"localhost": slots.local_slots()}
    assert slots.set_capacity("localhost:3,h2:4", tmp_path) == {"localhost": 3, "h2": 4}
    assert slots.set_capacity(None, tmp_path) == {"localhost": slots.local_slots()}
    with pytest.raises(ValueError, match="name:slots"):
        slots.set_capacity("localhost", tmp_path)


def test_a_run_that_could_never_start_is_refused_before_anything_is_created(tmp_path):
    slots.set_capacity("localhost:1", tmp_path)
    with pytest.raises(RunError, match="2 workers on localhost can never start"):
        slots.check_fits({"localhost": 2}, tmp_path)
    slots.check_fits({"localhost": 1, "elsewhere": 8}, tmp_path)  # undeclared hosts: theirs
    result = run_cli(
        ["launch", "experiments/quickstart.yaml", "--np", "2", "--name", "big"], tmp_path
    )
    assert result.returncode == 2
    assert "can never start" in result.stderr and "--capacity localhost:2" in result.stderr
    assert not (tmp_path / "big").exists()


def test_queue_command_sets_and_shows_the_capacity(tmp_path):
    result = run_cli(["queue", "--capacity", "localhost:3"], tmp_path)
    assert result.returncode == 0 and "capacity: localhost:3" in result.stdout
    run = _queued_run(tmp_path, "waiting-one")
    slots.enqueue(run, {"localhost": 4})
    shown = run_cli(["queue"], tmp_path).stdout
    assert "waiting-one  localhost:4  waiting #1" in shown
    bad = run_cli(["queue", "--capacity", "nope"], tmp_path)
    assert bad.returncode == 2 and "name:slots" in bad.stderr


def states_until(run: RunDir, last: str, timeout: float = 120.0) -> list[str]:
    """The states ``run`` passes through, each once in the order seen, until ``last``."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while not seen or seen[-1] != last:
        assert time.monotonic() < deadline, seen
        state = run.status()["state"]
        if not seen or seen[-1] != state:
            seen.append(state)
        time.sleep(0.05)
    return seen


def test_a_run_stopped_while_queued_never_starts(tmp_path):
    """One slot: the second launch waits; stopped there, its supervisor leaves without starting
    horovodrun, and it does not start when the slot frees up."""
    slots.set_capacity("localhost:1", tmp_path)
    config = from_mapping({**SMALL, "workers": 1, "epochs": 200})
    first = launcher.launch(config, runs_root_dir=tmp_path, run_id="first")
    seen = states_until(first, "running")
    assert seen[-2:] == ["starting", "running"], seen  # starting: slots held, workers importing
    path = tmp_path.parent / f"{tmp_path.name}-long.yaml"
    path.write_text(config.to_yaml())
    told = run_cli(["launch", str(path), "--name", "second"], tmp_path)
    assert "queued: number 1 in line for slots" in told.stdout, told.stdout + told.stderr
    second = RunDir(tmp_path / "second")
    assert second.status()["state"] == "queued"  # queued: waiting for a slot
    assert slots.positions(tmp_path) == {"second": 1}
    supervisor = psutil.Process(second.status()["pid"])
    launcher.stop("second", tmp_path)
    supervisor.wait(timeout=10)  # gone, without starting anything
    launcher.stop("first", tmp_path)
    assert wait(first)["state"] == "stopped"
    time.sleep(2 * slots.POLL_S)  # a free slot now: nothing may take it
    status = second.status()
    assert status["state"] == "stopped" and "launched" not in status
    assert [p["role"] for p in status["processes"]] == ["supervisor"]
    assert not second.events_path.exists()
    assert slots.entries(tmp_path) == []


def test_the_runs_page_shows_each_queued_runs_place(tmp_path, monkeypatch):

    monkeypatch.setenv("LBL_RUNS", str(tmp_path))
    slots.set_capacity("localhost:1", tmp_path)
    for name in ("holder", "next", "after"):
        slots.enqueue(_queued_run(tmp_path, name), {"localhost": 1})
    assert slots.try_start(RunDir(tmp_path / "holder")) is True
    at = dashboard().run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    places = dict(zip(table["run_id"], table["queue"]))
    assert places["next"] == 1 and places["after"] == 2 and pd.isna(places["holder"])
