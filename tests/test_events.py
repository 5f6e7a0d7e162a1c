"""Event log: writer, tolerant reader, incremental tail."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from toolkit.events import EventTail, EventWriter, read_events


def test_round_trip_with_varying_keys(tmp_path):
    path = tmp_path / "run" / "events.jsonl"
    with EventWriter(path) as writer:
        writer.write({"step": 1, "phase": "train", "loss": 2.5, "lr": 0.1})
        writer.write({"step": 1, "phase": "eval", "accuracy": 0.5, "wall": 123.0})
        writer.write({"step": 2, "phase": "train", "trust_ratio/conv1": np.float32(0.25)})

    events = read_events(path)
    assert list(events["step"]) == [1, 1, 2]
    assert list(events["phase"]) == ["train", "eval", "train"]
    assert set(events.columns) == {
        "wall",
        "step",
        "phase",
        "loss",
        "lr",
        "accuracy",
        "trust_ratio/conv1",
    }
    assert events["wall"].iloc[1] == 123.0  # given wall is kept
    assert events["wall"].iloc[0] > 1e9  # missing wall is added
    assert math.isnan(events["accuracy"].iloc[0])
    assert events["trust_ratio/conv1"].iloc[2] == 0.25


def test_each_record_is_one_valid_json_line_and_nonfinite_round_trips(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventWriter(path) as writer:
        writer.write({"step": 1, "loss": float("nan"), "grad": float("inf")})
        writer.write({"step": 2, "loss": np.float64("-inf"), "phase": "train"})

    lines = path.read_text().splitlines(keepends=True)
    assert len(lines) == 2 and all(line.endswith("\n") for line in lines)
    for line in lines:  # strict JSON: no bare NaN/Infinity tokens
        json.loads(line, parse_constant=lambda token: pytest.fail(token))

    events = read_events(path)
    assert events["loss"].dtype == float
    assert math.isnan(events["loss"].iloc[0])
    assert events["grad"].iloc[0] == math.inf
    assert events["loss"].iloc[1] == -math.inf


def test_writer_appends_to_an_existing_file(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventWriter(path) as writer:
        writer.write({"step": 1})
    with EventWriter(path) as writer:
        writer.write({"step": 2})
    assert list(read_events(path)["step"]) == [1, 2]


def test_missing_file_reads_empty(tmp_path):
    events = read_events(tmp_path / "nope.jsonl")
    assert events.empty


def test_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventWriter(path) as writer:
        writer.write({"step": 1, "loss": 1.0})
    with open(path, "a") as f:
        f.write('{"step": 2, "lo')  # a crash in the middle of a record

    assert list(read_events(path)["step"]) == [1]


def test_complete_but_invalid_lines_are_skipped(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "lo\n[1, 2]\n\n{"step": 3}\n')
    assert list(read_events(path)["step"]) == [1, 3]


def test_writer_terminates_a_torn_line_before_appending(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "lo')
    with EventWriter(path) as writer:
        writer.write({"step": 3})
    assert list(read_events(path)["step"]) == [1, 3]


def test_tail_returns_only_new_complete_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    tail = EventTail(path)
    assert tail.read_new().empty  # file does not exist yet

    writer = EventWriter(path)
    writer.write({"step": 1})
    writer.write({"step": 2})
    assert list(tail.read_new()["step"]) == [1, 2]
    assert tail.read_new().empty  # nothing new

    with open(path, "a") as f:  # a line being written: not yet returned
        f.write('{"step": 3, ')
    assert tail.read_new().empty
    with open(path, "a") as f:
        f.write('"loss": 0.5}\n')
    new = tail.read_new()
    assert list(new["step"]) == [3] and list(new["loss"]) == [0.5]

    writer.write({"step": 4})
    writer.close()
    assert list(tail.read_new()["step"]) == [4]
    assert not tail.restarted


def test_tail_starts_over_when_file_is_truncated(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventWriter(path) as writer:
        for step in range(5):
            writer.write({"step": step})
    tail = EventTail(path)
    assert len(tail.read_new()) == 5

    path.write_text('{"step": 100}\n')  # truncated in place (same inode), shorter
    assert list(tail.read_new()["step"]) == [100]
    assert tail.restarted


def test_tail_starts_over_when_file_is_replaced(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"step": 1}\n')
    tail = EventTail(path)
    assert list(tail.read_new()["step"]) == [1]

    replacement = tmp_path / "new.jsonl"
    replacement.write_text('{"step": 10}\n{"step": 11}\n{"step": 12}\n')
    os.replace(replacement, path)  # longer than the old offset, but a new file
    assert list(tail.read_new()["step"]) == [10, 11, 12]
    assert tail.restarted
    assert tail.read_new().empty and not tail.restarted
