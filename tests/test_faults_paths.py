"""Faults, class 1 and 2: a run id never resolves outside the runs root, nothing is deleted that
is not a run directory, no reader or writer follows a symlink, and of two racing requests on
one run exactly one wins (real processes)."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from toolkit import files
from toolkit.__main__ import main
from toolkit.config import from_mapping
from toolkit.files import WriteError
from toolkit.launching import launch as launcher
from toolkit.runs import rundir
from toolkit.runs.events import EventWriter, read_events
from toolkit.runs.rundir import RunDir, RunError, list_runs, resolve
from toolkit.runs.table import summary
from toolkit.terminal import runs_table

BAD_IDS = [".", "..", "../victim", ".hidden", "a/b", "", "x" * 65, "/etc", "run id"]


@pytest.fixture
def tree(tmp_path):
    """``tmp_path/root`` (the runs root, with one completed run ``ok``) beside
    ``tmp_path/victim``: a directory that nothing may touch."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    root = tmp_path / "root"
    run = RunDir.create(root, "ok", from_mapping({"name": "ok"}))
    run.set_status("completed", exit_code=0)
    return root, victim


def snapshot(path):
    return sorted((p.relative_to(path), p.stat().st_mtime_ns) for p in path.rglob("*"))


@pytest.mark.parametrize("run_id", BAD_IDS)
def test_an_invalid_id_is_refused_by_every_command_and_touches_nothing(run_id, tree, capsys):
    root, victim = tree
    before, parent = snapshot(victim), sorted(os.listdir(root.parent))
    for command in ("stop", "resume", "delete"):
        assert main(["--runs", str(root), command, run_id]) == 2, command
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err
    for call in (launcher.stop, launcher.resume, launcher.delete):
        with pytest.raises(RunError):
            call(run_id, root)
    with pytest.raises(RunError):
        resolve(run_id, root)
    with pytest.raises(RunError):
        RunDir.create(root, run_id)
    assert snapshot(victim) == before and sorted(os.listdir(root.parent)) == parent
    assert [r.run_id for r in list_runs(root)] == ["ok"]


def test_a_bad_launch_name_is_refused_before_anything_is_created(tree, capsys):
    root, _ = tree
    for name in ("..", ".", ".x"):
        code = main(["--runs", str(root), "launch", "experiments/quickstart.yaml", "--name", name])
        assert code == 2 and "run ids must" in capsys.readouterr().err
    assert os.listdir(root) == ["ok"]


def test_a_symlink_in_the_root_is_no_run_and_is_never_deleted(tree):
    root, victim = tree
    (victim / "status.json").write_text('{"state": "completed"}')
    (root / "link").symlink_to(victim)
    assert [r.run_id for r in list_runs(root)] == ["ok"]
    with pytest.raises(RunError, match="symlink"):
        launcher.delete("link", root)
    with pytest.raises(RunError, match="symlink"):
        launcher.stop("link", root)
    assert (victim / "precious.txt").read_text() == "keep me"


def test_delete_removes_symlinks_inside_a_run_without_following_them(tree):
    root, victim = tree
    run = resolve("ok", root)
    (run.path / "stdout.log").symlink_to(victim / "precious.txt")
    (run.checkpoints_path).mkdir()
    (run.checkpoints_path / "epoch-0001").symlink_to(victim, target_is_directory=True)
    launcher.delete("ok", root)
    assert not run.path.exists() and os.listdir(root) == []
    assert (victim / "precious.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    "contents",
    [{"notes.md": "mine"}, {"status.json": '{"state": "failed"}', "thesis.tex": "mine"}, {}],
)
def test_delete_refuses_a_directory_that_is_not_a_run(contents, tree):
    root, _ = tree
    folder = root / "mine"
    folder.mkdir()
    for name, text in contents.items():
        (folder / name).write_text(text)
    with pytest.raises(RunError, match="does not look like a run directory"):
        launcher.delete("mine", root)
    assert sorted(os.listdir(folder)) == sorted(contents)


def test_readers_never_follow_a_symlink_out_of_a_run(tree, tmp_path):
    root, victim = tree
    secret = victim / "precious.txt"
    outside = tmp_path / "outside.jsonl"
    with EventWriter(outside) as writer:
        writer.write({"step": 1, "phase": "train", "loss": 0.5})
    run = resolve("ok", root)
    for name, target in (("stdout.log", secret), ("events.jsonl", outside)):
        (run.path / name).symlink_to(target)
    (run.path / "config.yaml").unlink()
    (run.path / "config.yaml").symlink_to(secret)
    with pytest.raises(OSError, match="symlink"):
        read_events(run.events_path)
    row = summary(run)
    assert row["last_loss"] is None and "unreadable" in row["reason"] and "symlink" in row["reason"]
    assert "keep me" not in runs_table(root)

    from app import data

    assert files.tail(run.stdout_path) == "" and data.text(run.stdout_path) == ""
    assert data.config(run) is None


def test_writers_never_follow_a_symlink_out_of_a_run(tree):
    from toolkit.runs import checkpoints

    root, victim = tree
    run = resolve("ok", root)
    secret = victim / "precious.txt"
    run.events_path.symlink_to(secret)
    with pytest.raises(WriteError, match="while writing events.jsonl"):
        EventWriter(run.events_path)
    run.config_path.unlink()
    run.config_path.symlink_to(secret)
    run.write_config(from_mapping({"name": "ok"}))  # replaces the link, not its target
    assert not run.config_path.is_symlink() and run.config().name == "ok"
    run.set_status("failed")
    (victim / "epoch-0001").mkdir()
    run.checkpoints_path.symlink_to(victim, target_is_directory=True)
    assert checkpoints.latest(run.checkpoints_path) is None
    with pytest.raises(WriteError, match="while writing checkpoints/epoch-0009"):
        checkpoints.save(run.checkpoints_path, None, checkpoints.Position(9, 90), keep=0)
    assert sorted(os.listdir(victim)) == ["epoch-0001", "precious.txt"]
    assert secret.read_text() == "keep me"


# --- One owner per run ------------------------------------------------------------------------


def _create_after(barrier, root, run_id, config, results):
    barrier.wait()
    try:
        RunDir.create(root, run_id, config)
        results.put("won")
    except RunError as error:
        results.put(str(error))


def test_of_eight_processes_creating_one_run_exactly_one_wins(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(8), ctx.Queue()
    config = from_mapping({"name": "race"})
    workers = [
        ctx.Process(target=_create_after, args=(barrier, tmp_path, "race", config, results))
        for _ in range(8)
    ]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(10)
    assert outcomes.count("won") == 1, outcomes
    assert all("already exists" in o for o in outcomes if o != "won")
    assert os.listdir(tmp_path) == ["race"]  # no staging directory left behind
    assert RunDir(tmp_path / "race").config().name == "race"


def _hold_lock(path, ready):
    with RunDir(path).lock():
        ready.set()
        time.sleep(600)


def test_the_run_lock_is_exclusive_and_released_when_its_holder_dies(tree, monkeypatch):
    root, _ = tree
    run = resolve("ok", root)
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(run.path, ready))
    holder.start()
    assert ready.wait(60)
    monkeypatch.setattr(rundir, "LOCK_TIMEOUT_S", 0.5)
    for call in (launcher.stop, launcher.resume, launcher.delete):
        with pytest.raises(RunError, match="busy"):
            call("ok", root)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    launcher.delete("ok", root)  # the dead holder's lock is gone
    assert os.listdir(root) == []


def test_a_waiter_on_a_deleted_run_is_told_it_was_deleted(tree):
    root, _ = tree
    run = resolve("ok", root)
    with run.lock():
        launcher.delete("ok", root)  # re-entrant in this process
    with pytest.raises(RunError):
        launcher.resume(run)


def cli(runs, *args, env, timeout=240):
    return subprocess.Popen(
        [sys.executable, "-m", "toolkit", "--runs", str(runs), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def outcomes(procs, timeout=240):
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        done.append((proc.returncode, out, err))
    return done


def test_two_launches_with_one_name_one_wins_the_other_exits_2(tmp_path, subprocess_env):
    runs = tmp_path / "runs"
    args = ("launch", "experiments/quickstart.yaml", "--name", "same", "--set", "epochs=1")
    results = outcomes([cli(runs, *args, env=subprocess_env) for _ in range(2)])
    codes = sorted(code for code, *_ in results)
    assert codes == [0, 2], results
    loser = next(err for code, _, err in results if code == 2)
    assert "already exists" in loser and "Traceback" not in loser
    launcher.stop("same", runs)
    assert sorted(os.listdir(runs)) == ["same"]


def test_two_resumes_at_once_start_one_training(tmp_path, subprocess_env):
    runs = tmp_path / "runs"
    config = from_mapping({"name": "twice", "epochs": 100, "workers": 2})
    run = RunDir.create(runs, "twice", config)
    (run.checkpoints_path / "epoch-0001").mkdir(parents=True)
    run.set_status("stopped", exit_code=0)
    results = outcomes([cli(runs, "resume", "twice", env=subprocess_env) for _ in range(2)])
    assert sorted(code for code, *_ in results) == [0, 2], results
    loser = next(err for code, _, err in results if code == 2)
    # the first is queued, starting or running by then, as the machine's load has it
    assert re.search(r"is (queued|starting|running)", loser) and "Traceback" not in loser
    supervisors = [p for p in run.status()["processes"] if p["role"] == "supervisor"]
    assert len(supervisors) == 1
    launcher.stop("twice", runs)


def test_a_completed_run_is_not_resumed(tree, capsys):
    root, _ = tree
    (resolve("ok", root).checkpoints_path / "epoch-0001").mkdir(parents=True)
    assert main(["--runs", str(root), "resume", "ok"]) == 2
    assert "is completed: only a stopped or failed run resumes" in capsys.readouterr().err
    assert resolve("ok", root).status()["state"] == "completed"
