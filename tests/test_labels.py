"""Run names, tags and notes through the CLI and Python (the app's door is in test_app), a bad
config refused at once, without TensorFlow, and the CLI's manners: help on every argument,
quiet when its reader leaves, a stop of an ended run told so."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT, run_cli

from toolkit.config import from_mapping
from toolkit.runs import rundir
from toolkit.runs.rundir import RunDir
from toolkit.terminal import runs_table


def test_tags_and_notes_round_trip_between_the_cli_and_python(tmp_path):
    run = RunDir.create(tmp_path, "labelled")
    assert run.tags() == [] and run.notes() == ""
    result = run_cli(["tag", "labelled", "baseline", " lr sweep "], tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == "baseline, lr sweep", result
    assert run.tags() == ["baseline", "lr sweep"]  # trimmed, sorted

    assert run.set_tags(add=["wd"], remove=["baseline"]) == ["lr sweep", "wd"]
    result = run_cli(["tag", "labelled"], tmp_path)
    assert result.stdout.strip() == "lr sweep, wd"

    result = run_cli(["note", "labelled", "warmup too short?"], tmp_path)
    assert result.returncode == 0 and run.notes() == "warmup too short?"
    run.set_notes("line one\nline two")
    assert run_cli(["note", "labelled"], tmp_path).stdout == "line one\nline two\n"
    stdin = subprocess.run(
        [sys.executable, "-m", "toolkit", "--runs", str(tmp_path), "note", "labelled", "-"],
        cwd=ROOT,
        input="from stdin\n",
        capture_output=True,
        text=True,
    )
    assert stdin.returncode == 0 and run.notes() == "from stdin"


@pytest.mark.parametrize("tag", ["", "   ", "a,b", "tab\there", "x" * 65])
def test_a_bad_tag_is_refused_naming_it_and_changes_nothing(tag, tmp_path):
    run = RunDir.create(tmp_path, "kept")
    run.set_tags(["ok"])
    with pytest.raises(ValueError, match="must be 1 to 64 printable characters"):
        run.set_tags(["fine", tag])
    result = run_cli(["tag", "kept", "fine", tag], tmp_path)
    assert result.returncode == 2 and "error: tag " in result.stderr
    assert run.tags() == ["ok"]
    with pytest.raises(ValueError, match="at most 10,000 characters"):
        run.set_notes("n" * 10_001)


def test_runs_filters_by_tag_and_searches_ids_tags_and_notes(tmp_path):
    RunDir.create(tmp_path, "alpha").set_tags(["baseline", "lars"])
    RunDir.create(tmp_path, "beta").set_tags(["lars"])
    RunDir.create(tmp_path, "gamma").set_notes("Diverged at epoch 3")

    def listed(**filters) -> set[str]:
        lines = runs_table(tmp_path, **filters).splitlines()
        return set() if lines[0].startswith("no runs") else {line.split()[0] for line in lines[1:]}

    assert listed() == {"alpha", "beta", "gamma"}
    assert listed(tags=["lars"]) == {"alpha", "beta"}
    assert listed(tags=["lars", "baseline"]) == {"alpha"}
    assert listed(search="DIVERGED") == {"gamma"}  # notes, any case
    assert listed(search="basel") == {"alpha"}  # tags
    assert listed(search="bet") == {"beta"}  # ids
    assert listed(tags=["nothing"]) == set()
    result = run_cli(["runs", "--tag", "lars", "--search", "alp"], tmp_path)
    assert [line.split()[0] for line in result.stdout.splitlines()[1:]] == ["alpha"]


def test_runs_whose_reader_leaves_ends_quietly(tmp_path, subprocess_env):
    """``runs | head``: the reader has gone before the table is written; no BrokenPipeError
    traceback, exit 0."""
    RunDir.create(tmp_path, "alpha")
    command = [sys.executable, "-m", "toolkit", "--runs", str(tmp_path), "runs"]
    reading = subprocess.Popen(
        command, cwd=ROOT, env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    reading.stdout.close()
    said = reading.stderr.read().decode()
    assert reading.wait(timeout=60) == 0 and said == "", said


def test_a_run_id_may_be_given_by_its_unique_start(tmp_path):
    for run_id in ("quick-b64-lars-1a2b", "quick-b64-lars-9f8e", "baseline-b64-sgd-0c0d"):
        RunDir.create(tmp_path, run_id)
    assert rundir.complete_id("baseline", tmp_path) == "baseline-b64-sgd-0c0d"
    assert rundir.complete_id("quick-b64-lars-9", tmp_path) == "quick-b64-lars-9f8e"
    result = run_cli(["tag", "baseline", "sgd"], tmp_path)
    assert result.returncode == 0 and RunDir(tmp_path / "baseline-b64-sgd-0c0d").tags() == ["sgd"]
    result = run_cli(["stop", "quick"], tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: 'quick' starts 2 run ids (quick-b64-lars-1a2b, quick-b64-lars-9f8e): give more "
        "of it"
    )
    assert rundir.complete_id("zeta", tmp_path) == "zeta"  # resolve says there is none
    with pytest.raises(rundir.RunError, match="no run 'baseline'"):  # held ids: whole only
        rundir.resolve("baseline", tmp_path)


def test_stop_on_a_run_that_has_ended_says_there_is_nothing_to_stop(tmp_path):
    RunDir.create(tmp_path, "done").set_status("completed")
    result = run_cli(["stop", "done"], tmp_path)
    assert result.returncode == 0
    assert result.stdout.strip() == "done had already ended (completed): nothing to stop"
    assert RunDir(tmp_path / "done").status()["state"] == "completed"


def test_default_run_ids_are_short_descriptive_and_unique(tmp_path, monkeypatch):
    config = from_mapping(
        {"name": "quickstart", "optimizer": {"name": "lars"}, "batch": {"per_worker": 64}}
    )
    draws, real = iter(["3f2a", "3f2a", "3f2a", "77b0"]), rundir.secrets.token_hex
    monkeypatch.setattr(rundir.secrets, "token_hex", lambda n: next(draws) if n == 2 else real(n))
    first = RunDir.create_new(tmp_path, config)
    second = RunDir.create_new(tmp_path, config)  # 3f2a is taken: drawn again
    assert (first.run_id, second.run_id) == ("quickstart-b64-lars-3f2a", "quickstart-b64-lars-77b0")


def test_a_bad_config_is_refused_at_once_without_tensorflow(tmp_path, subprocess_env):
    """Names, types and ranges are checked without importing TensorFlow; only a registered
    constructor's parameters need it."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nbatch: {per_worker: -3}\nmodel: {name: vgg}\n")
    code = (
        "import sys, time\n"
        "from toolkit.__main__ import main\n"
        "start = time.perf_counter()\n"
        f"code = main(['--runs', {str(tmp_path / 'runs')!r}, 'launch', {str(bad)!r}])\n"
        "print(code, time.perf_counter() - start, 'tensorflow' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=subprocess_env, capture_output=True, text=True
    )
    status, seconds, imported = result.stdout.split()
    assert status == "2" and imported == "False", result
    assert float(seconds) < 1.0
    assert "batch.per_worker: Input should be greater than or equal to 1" in result.stderr
    assert "model: unknown model 'vgg'; choose one of" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_every_argument_of_every_command_has_help():
    import argparse

    from toolkit.__main__ import build_parser

    missing = []

    def walk(parser: argparse.ArgumentParser, command: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{command} {name}".strip())
            elif not action.help:
                missing.append(f"{command}: {'/'.join(action.option_strings) or action.dest}")

    walk(build_parser(), "")
    assert missing == []
