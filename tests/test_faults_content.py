"""Faults, class 5: every reader survives any content. Many malformed run directories (wrong
types, directories in place of files, empty and binary files, symlinks, a FIFO) are generated,
systematically and with hypothesis; the CLI table and every dashboard page must render them
without an exception, list each broken run as broken, and never let it break another."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
from conftest import dashboard, run_cli
from fabricate import fake_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.runs.events import TEXT_KEYS, read_events
from toolkit.runs.rundir import STATES, UNREADABLE, RunDir, list_runs
from toolkit.runs.table import summary
from toolkit.terminal import runs_table

JSON_FILES = ("status.json", "meta.json")
FILES = (*JSON_FILES, "config.yaml", "events.jsonl", "stdout.log")

# Bad content for any file: (label, how to make it).
ANY_FILE = {
    "missing": lambda path, outside: path.unlink(),
    "empty": lambda path, outside: path.write_bytes(b""),
    "binary": lambda path, outside: path.write_bytes(bytes(range(256)) * 4),
    "directory": lambda path, outside: (path.unlink(), path.mkdir()),
    "symlink-outside": lambda path, outside: (path.unlink(), path.symlink_to(outside)),
    "dangling-symlink": lambda path, outside: (path.unlink(), path.symlink_to(outside / "nope")),
    "fifo": lambda path, outside: (path.unlink(), os.mkfifo(path)),
}
# Bad JSON for status.json / meta.json.
BAD_JSON = {
    "bare-string": '"running"',
    "list": "[]",
    "number": "7",
    "null": "null",
    "garbage": "{not json",
    "wrong-types": json.dumps(
        {
            "state": "running",
            "pid": "abc",
            "processes": [{"pid": "x"}, 5],
            "started": "yesterday",
            "finished": [1],
            "exit_code": True,
            "updated": {"a": 1},
            "created": "now",
            "world_size": "two",
            "global_batch": 2.5,
            "total_steps": None,
        }
    ),
    "unknown-state": '{"state": "exploded", "pid": 1}',
    "bool-pid": '{"state": "running", "pid": true}',
    "huge-pid": '{"state": "running", "pid": 99999999999999999999}',
    "negative-pid": '{"state": "running", "pid": -1, "processes": [{"role": "worker", '
    '"pid": -5, "started": 1.0}]}',
}
BAD_EVENTS = {
    "string-step-epoch": b'{"step": "5", "epoch": "x", "phase": "train", "loss": 1.0}\n'
    b'{"step": 6, "epoch": 0.1, "phase": "train", "loss": 0.9, "accuracy": 0.2}\n',
    "odd-values": b'{"step": 1, "phase": 3, "loss": [1], "accuracy": {"a": 1}, "wall": true}\n'
    b'{"step": null, "phase": null, "loss": "NaN", "lr": "Infinity"}\n',
    "only-torn": b'{"step": 1, "pha',
    "not-objects": b'[1]\n2\n"s"\nnull\n',
    "nul-bytes": b"\0" * 100 + b"\n" + b'{"step": 1, "phase": "eval", "accuracy": 0.5}\n',
    "huge-numbers": b'{"step": 1e308, "epoch": -1e308, "phase": "train", "loss": 1e400}\n',
}
BAD_CONFIGS = {
    "yaml-list": "- 1\n- 2\n",
    "unknown-field": "name: x\nbogus: 1\n",
    "wrong-type": "epochs: many\n",
    "tagged": "seed: !!python/object/apply:os.system [echo hi]\n",
}


def cases() -> list[tuple[str, str, object]]:
    out = [(f, label, make) for f in FILES for label, make in ANY_FILE.items()]
    out += [(f, label, text) for f in JSON_FILES for label, text in BAD_JSON.items()]
    out += [("events.jsonl", label, raw) for label, raw in BAD_EVENTS.items()]
    out += [("config.yaml", label, text) for label, text in BAD_CONFIGS.items()]
    return out


@pytest.fixture(scope="module")
def malformed(tmp_path_factory):
    """A runs root holding one good run and one run per malformation; ``{run_id: (file,
    label)}``. Each broken run is a complete fabricated run with one file spoiled."""
    root = tmp_path_factory.mktemp("runs")
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret.txt").write_text("SECRET\n")
    (outside / "events.jsonl").write_text('{"step": 1, "phase": "train", "loss": 123.0}\n')
    fake_run(root, "good", events=200)
    made = {}
    for index, (name, label, spoil) in enumerate(cases()):
        run_id = f"bad{index:03d}-{name.split('.')[0]}-{label}"
        run = fake_run(root, run_id, events=60, state="running" if index % 2 else "completed")
        path = run.path / name
        if callable(spoil):
            target = outside / ("events.jsonl" if name == "events.jsonl" else "secret.txt")
            spoil(path, target if "outside" in label else outside)
        else:
            path.write_bytes(spoil if isinstance(spoil, bytes) else spoil.encode())
        made[run_id] = (name, label)
    return root, made


def test_the_runs_table_lists_every_run_and_names_what_is_broken(malformed):
    root, made = malformed
    rows = {row["run_id"]: row for row in map(summary, list_runs(root))}
    assert set(rows) == {"good", *made}
    good = rows["good"]
    assert good["state"] == "completed" and good["reason"] is None and good["last_step"] > 0
    for run_id, (name, label) in made.items():
        row = rows[run_id]
        assert row["state"] in (*STATES, UNREADABLE), (run_id, row)
        if name == "status.json" and label not in ("missing",):
            assert row["state"] in ("failed", UNREADABLE), (run_id, row)
        harmless = ("missing", "empty", "binary") if name == "events.jsonl" else ("missing",)
        if name in ("config.yaml", "events.jsonl") and label in ANY_FILE and label not in harmless:
            assert row["reason"] and "unreadable" in row["reason"], (run_id, row)
        if name == "config.yaml" and label != "missing":
            assert row["optimizer"] is None, (run_id, row)  # never the schema's default
    table = runs_table(root)
    assert "SECRET" not in table and "123" not in table
    assert len(table.splitlines()) == len(made) + 2


def test_the_cli_lists_malformed_runs_and_exits_0(malformed):
    root, made = malformed
    result = run_cli(["runs"], root)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and len(result.stdout.splitlines()) == len(made) + 2


def test_events_of_the_wrong_type_are_dropped_per_field(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(BAD_EVENTS["string-step-epoch"] + BAD_EVENTS["odd-values"])
    events = read_events(path)
    assert len(events) == 4  # every record stays; only its bad fields go
    for column in ("step", "epoch", "loss", "accuracy", "wall", "lr"):
        assert pd.api.types.is_float_dtype(events[column]), column
    nan = float("nan")
    assert events["step"].tolist() == pytest.approx([nan, 6, 1, nan], nan_ok=True)
    assert events["epoch"].tolist() == pytest.approx([nan, 0.1, nan, nan], nan_ok=True)
    assert events["loss"].tolist() == pytest.approx([1.0, 0.9, nan, nan], nan_ok=True)
    assert events["accuracy"].isna().tolist() == [True, False, True, True]
    assert events["lr"].iloc[3] == float("inf") and events["wall"].isna().all()
    assert events["phase"].tolist()[:2] == ["train", "train"] and events.phase[2:].isna().all()


def test_every_page_renders_every_malformed_run(malformed, monkeypatch):
    root, made = malformed
    monkeypatch.setenv("LBL_RUNS", str(root))
    at = dashboard(timeout=120).run()
    assert not at.exception, at.exception
    shown = " ".join(str(e.value) for e in at.code) + " ".join(t.value for t in at.text)
    assert "SECRET" not in shown
    at.switch_page("views/compare.py")
    at.session_state["compare_runs"] = ["good", *made]
    at.run()
    assert not at.exception, at.exception
    at.switch_page("views/runs.py").run()  # every run in one table: drawn once
    assert not at.exception, at.exception
    assert "SECRET" not in " ".join(str(e.value) for e in at.code)
    for run_id in made:
        at.session_state["current_run"] = run_id
        at.switch_page("views/detail.py").run()
        assert not at.exception, (run_id, at.exception)
        shown = " ".join(str(e.value) for e in at.code)
        assert "SECRET" not in shown, run_id


# --- Property-based: any JSON in the status, meta and events files ---------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=6,
)
KEYS = st.sampled_from(
    ["state", "pid", "processes", "started", "finished", "updated", "exit_code", "reason"]
    + ["stop_requested", "created", "world_size", "global_batch", "total_steps", "step"]
    + ["epoch", "phase", "loss", "accuracy", "wall", "lr", "other"]
)
objects = st.dictionaries(KEYS, json_values | st.sampled_from(["running", "train", "eval"]))
documents = objects | json_values


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("property")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(status=documents, meta=documents, events=st.lists(documents, max_size=6))
def test_any_json_in_a_runs_files_reads_without_an_exception(status, meta, events, scratch):
    run = RunDir(scratch / "run")
    run.path.mkdir(exist_ok=True)
    run.status_path.write_text(json.dumps(status))
    run.meta_path.write_text(json.dumps(meta))
    run.events_path.write_text("".join(json.dumps(e) + "\n" for e in events))
    state = run.status()["state"]
    assert state in (*STATES, UNREADABLE)
    if not isinstance(status, dict) or status.get("state") not in STATES:
        assert state == UNREADABLE
    row = summary(run)
    assert row["run_id"] == "run" and row["state"] == state
    frame = read_events(run.events_path)
    for column in set(frame.columns) - set(TEXT_KEYS):
        assert pd.api.types.is_numeric_dtype(frame[column]), column
        assert not pd.api.types.is_bool_dtype(frame[column]), column
    for column in set(frame.columns) & set(TEXT_KEYS):  # phase, an elastic reset's reason, hosts
        assert frame[column].map(lambda v: isinstance(v, str) or pd.isna(v)).all(), column
