"""Event log: writer, tolerant reader, incremental tail."""

from __future__ import annotations

import json
import math
import os
import shutil

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.runs import events
from toolkit.runs.events import EventTail, EventWriter, copy_path, read_events, truncate_after


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


def test_a_tail_from_a_saved_position_reads_on_from_it(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventWriter(path) as writer:
        writer.write({"step": 1})
        writer.write({"step": 2})
    first = EventTail(path)
    assert list(first.read_new()["step"]) == [1, 2]
    position = json.loads(json.dumps(first.position()))  # as another process would keep it
    with EventWriter(path) as writer:
        writer.write({"step": 3})
    later = EventTail(path, position)
    assert list(later.read_new()["step"]) == [3]
    assert not later.restarted and later.read_new().empty


@pytest.mark.parametrize("change", ["rewritten in place", "replaced", "shorter"])
def test_a_saved_position_that_no_longer_matches_its_log_starts_over(tmp_path, change):
    path = tmp_path / "events.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n')
    tail = EventTail(path)
    tail.read_new()
    position = tail.position()
    if change == "rewritten in place":  # same inode and length, other bytes
        path.write_text('{"step": 7}\n{"step": 8}\n{"step": 9}\n')
    elif change == "replaced":
        (tmp_path / "new.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 9}\n')
        os.replace(tmp_path / "new.jsonl", path)
    else:
        path.write_text('{"step": 9}\n')
    later = EventTail(path, position)
    steps = list(later.read_new()["step"])
    assert later.restarted
    assert steps == {"shorter": [9], "replaced": [1, 2, 9]}.get(change, [7, 8, 9])


# The columnar copy (events.parquet): a cache that must never change what is read.


def parsed_without_copy(path, tmp_path_factory):
    """The oracle: the same bytes read from a fresh directory, with no copy ever made."""
    fresh = tmp_path_factory.mktemp("plain") / "events.jsonl"
    fresh.write_bytes(path.read_bytes())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(events, "COPY_AFTER", math.inf)
        frame = read_events(fresh)
    assert not copy_path(fresh).exists()
    return frame


def write_records(path, count, start=0):
    with EventWriter(path) as writer:
        for step in range(start, start + count):
            loss = float("nan") if step == 7 else 2.0 / (step + 1)
            writer.write({"step": step, "phase": "train", "loss": loss, "lr": 0.1, "wall": step})
            if step % 50 == 49:
                writer.write({"step": step, "phase": "eval", "accuracy": step / 1e4})


def test_closing_a_large_log_leaves_a_copy_that_reads_the_same(tmp_path, tmp_path_factory):
    path = tmp_path / "events.jsonl"
    write_records(path, 4000)
    assert path.stat().st_size > events.COPY_AFTER and copy_path(path).is_file()

    frame = read_events(path)
    pd.testing.assert_frame_equal(frame, parsed_without_copy(path, tmp_path_factory))
    assert len(frame) == 4000 + 80 and math.isnan(frame["loss"].iloc[7])
    assert frame["phase"].dtype == "str" and frame["step"].dtype == "int64"


def test_a_read_parses_only_the_bytes_after_the_copy(tmp_path, monkeypatch):
    path = tmp_path / "events.jsonl"
    write_records(path, 4000)
    copied = path.stat().st_size
    write_records(path, 10, start=4000)
    parsed = []
    real = events._records
    monkeypatch.setattr(events, "_records", lambda data: parsed.append(len(data)) or real(data))

    frame = read_events(path)
    assert parsed == [path.stat().st_size - copied]
    assert frame["step"].iloc[-1] == 4009 and len(frame) == 4010 + 80


def test_a_tail_begins_with_the_copy_then_reads_only_new_lines(tmp_path, monkeypatch):
    path = tmp_path / "events.jsonl"
    write_records(path, 4000)  # closing the writer leaves a copy of all of it
    with open(path, "ab") as f:
        f.write(b'{"step": 4000, "phase": "train", "loss": 0.5}\n')
    parsed = []
    real = events._records
    monkeypatch.setattr(events, "_records", lambda data: parsed.append(len(data)) or real(data))

    tail = EventTail(path)
    first = tail.read_new()
    assert len(first) == 4000 + 80 + 1 and first["step"].iloc[-1] == 4000
    assert len(parsed) == 1 and parsed[0] < 100  # the appended line, not the log
    with open(path, "ab") as f:
        f.write(b'{"step": 4001, "phase": "train", "loss": 0.4}\n')
    assert tail.read_new()["step"].tolist() == [4001] and not tail.restarted


def test_a_small_log_is_read_without_a_copy(tmp_path):
    path = tmp_path / "events.jsonl"
    write_records(path, 20)
    assert len(read_events(path)) == 20 and not copy_path(path).exists()


def test_the_copy_follows_a_growing_log_with_new_columns_and_bad_lines(
    tmp_path, tmp_path_factory, monkeypatch
):
    monkeypatch.setattr(events, "COPY_AFTER", 1)  # rewrite the copy at every read
    path = tmp_path / "events.jsonl"
    chunks = [
        b'{"step": 1, "phase": "train", "loss": 1.0}\n{"step": 2, "phase": "train", "loss": 0.9}\n',
        b'{"step": 3, "phase": "eval", "acc": 0.5, "loss": "NaN"}\n{"step": 4, "lo',
        b'ss": 0.7}\n{"step": "x", "phase": 5, "loss": true}\n[1]\n',
        b'{"step": 6, "new/column": 3, "phase": "train"}\n{"step": 7.5}\n',
    ]
    for chunk in chunks:
        with open(path, "ab") as f:
            f.write(chunk)
        assert copy_path(path).exists() or chunk is chunks[0]
        expected = parsed_without_copy(path, tmp_path_factory)
        pd.testing.assert_frame_equal(read_events(path), expected)
        pd.testing.assert_frame_equal(read_events(path), expected)  # from the copy alone
    assert read_events(path)["step"].tolist() == pytest.approx(
        [1, 2, 3, 4, math.nan, 6, 7.5], nan_ok=True
    )


values = (
    st.none() | st.booleans() | st.integers(-(2**66), 2**66) | st.floats() | st.text(max_size=4)
)
records = st.dictionaries(st.sampled_from(["step", "phase", "loss", "a/b"]), values, max_size=4)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(chunks=st.lists(st.lists(records, max_size=4), min_size=1, max_size=4))
def test_any_log_read_through_its_copy_reads_as_parsed(chunks, tmp_path_factory):
    events.COPY_AFTER, saved = 1, events.COPY_AFTER
    try:
        path = tmp_path_factory.mktemp("log") / "events.jsonl"
        for chunk in chunks:
            with open(path, "ab") as f:
                f.write(b"".join(json.dumps(r).encode() + b"\n" for r in chunk))
            expected = parsed_without_copy(path, tmp_path_factory)
            pd.testing.assert_frame_equal(read_events(path), expected)
    finally:
        events.COPY_AFTER = saved


def rewrite_in_place(path, data):
    with open(path, "r+b") as f:  # the same inode
        f.write(data)


@pytest.mark.parametrize(
    "change",
    [
        "replaced by another log",
        "rewritten in place",
        "rewound",
        "run directory copied",
        "copy is garbage",
        "copy cannot be written",
    ],
)
def test_a_copy_that_does_not_match_its_log_is_never_used(change, tmp_path, tmp_path_factory):
    path = tmp_path / "run" / "events.jsonl"
    write_records(path, 4000)
    assert copy_path(path).is_file()
    if change == "replaced by another log":
        other = tmp_path / "other.jsonl"
        write_records(other, 4000, start=100)
        os.replace(other, path)
    elif change == "rewritten in place":
        shifted = tmp_path / "shifted.jsonl"
        write_records(shifted, 4000, start=1)
        rewrite_in_place(path, shifted.read_bytes())
    elif change == "rewound":
        truncate_after(path, 999)
        assert not copy_path(path).exists()
        write_records(path, 4000, start=5000)
    elif change == "run directory copied":
        shutil.copytree(path.parent, tmp_path / "clone")
        path = tmp_path / "clone" / "events.jsonl"
        write_records(path, 3, start=4000)
    elif change == "copy is garbage":
        copy_path(path).write_bytes(b"PAR1 not really")
    else:
        copy_path(path).unlink()
        copy_path(path).mkdir()

    expected = parsed_without_copy(path, tmp_path_factory)
    pd.testing.assert_frame_equal(read_events(path), expected)
    pd.testing.assert_frame_equal(read_events(path), expected)
