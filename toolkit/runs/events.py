"""The event log of a run: ``runs/<id>/events.jsonl``, one flat JSON object per line.

A record looks like ``{"step": 120, "epoch": 1.5, "wall": 1763820000.12, "phase": "train",
"lr": 0.4, "loss": 1.23}``; any other keys may appear, so readers never assume a fixed set.

Non-finite floats are not valid JSON. They are written as the strings ``"NaN"``, ``"Infinity"``
and ``"-Infinity"`` (the spellings Python and JavaScript use) and read back as floats, so a
diverged loss stays visible as ``nan``/``inf`` in the DataFrame. A consequence: a string value
spelled exactly like one of those three is read back as a float.

Only complete lines (ending in a newline) are read. The writer sends each record to the
operating system in a single ``write``, so a crash leaves at most one torn line, which readers
skip (as they skip any line that is not a JSON object, or is an empty one). A value of the
wrong type is dropped from its record, not the record from the file: the values of
:data:`TEXT_KEYS` (``phase``, an elastic reset's ``reason`` and ``hosts``, and a damaged
checkpoint's name, ``reason`` and the ``resumed_from`` checkpoint) must be strings
and every other value a number (or null); a string, list, object or boolean elsewhere is read as
missing.
The file is opened as :mod:`toolkit.files` says: never through a symlink.

**The columnar copy.** Parsing JSON costs 4 to 8 µs an event, so a run of 50,000 events would
take up to 0.4 s to open every time. :func:`read_events` therefore keeps ``events.parquet``
beside the log: the records of the log's first ``offset`` bytes, exactly as parsing them
returns them. A read (and a tail's first read) loads the copy (milliseconds) and parses only
the bytes after it. When those reach :data:`COPY_AFTER`, :func:`read_events` rewrites the copy
(atomically, whichever reader gets there); closing an :class:`EventWriter` does the same, so a
finished run opens fast the first time. The copy is used only while it matches its log: the
same file (device and inode), at least ``offset`` bytes long, with the same last bytes before
``offset``. Anything else (a log replaced, rewound or copied elsewhere, a copy that does not
read as Parquet) is ignored and rebuilt, and a directory that cannot be written (a read-only
copy of a run) is simply read without one.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Self

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from toolkit import files

_NONFINITE = ("NaN", "Infinity", "-Infinity")
TEXT_KEYS = ("phase", "reason", "hosts", "checkpoint", "resumed_from")
"""The keys whose values are text; every other key's are numbers."""
COPY_AFTER = 256 * 1024
"""Bytes of a log past its columnar copy at which a read rewrites the copy."""
_COPY_KEY = b"toolkit.runs.events"  # the Parquet metadata entry that ties a copy to its log
_CHECKED_BYTES = 64  # how many bytes before the copy's offset must match


def _encode(value: Any) -> Any:
    """A JSON-ready value: numpy scalars become Python ones, non-finite floats strings."""
    if isinstance(value, (np.generic, np.ndarray)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    return value


def _decode(value: Any) -> Any:
    return float(value) if isinstance(value, str) and value in _NONFINITE else value


def _records(data: bytes) -> list[dict[str, Any]]:
    """The JSON objects among the newline-separated lines of ``data``; other lines (and empty
    objects, which record nothing) are skipped.

    The common case, every line valid, is parsed in one ``json.loads`` (about twice as fast as
    line by line); only a file with a bad line pays for the per-line fallback.
    """
    lines = [line for line in data.splitlines() if line.strip()]
    try:
        parsed = json.loads(b"[" + b",".join(lines) + b"]")
    except ValueError:  # a torn line, or not UTF-8: parse line by line and skip the bad ones
        parsed = []
        for line in lines:
            try:
                parsed.append(json.loads(line))
            except ValueError:
                continue
    records = [record for record in parsed if isinstance(record, dict) and record]
    if any(word.encode() in data for word in _NONFINITE):
        records = [{key: _decode(value) for key, value in r.items()} for r in records]
    return records


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """The records as a DataFrame, with values of the wrong type dropped (see the module doc).
    Only columns pandas did not type as numbers are looked at, so a clean file costs little."""
    frame = pd.DataFrame.from_records(records)
    for name in frame.columns:
        column = frame[name]
        if name in TEXT_KEYS:
            if pd.api.types.infer_dtype(column, skipna=True) not in ("string", "empty"):
                column = column.where(column.map(lambda v: isinstance(v, str)))
            if name == "phase":  # always pandas' string dtype, whatever the file holds
                column = column.astype("str")
            frame[name] = column
        elif pd.api.types.is_bool_dtype(column) or not pd.api.types.is_numeric_dtype(column):
            frame[name] = pd.to_numeric(column.where(column.map(_is_number)), errors="coerce")
    return frame


def parse(data: bytes) -> pd.DataFrame:
    """The records among ``data``'s complete lines, as a DataFrame (the JSON parser alone: no
    columnar copy is read or written)."""
    return _frame(_records(data))


NOT_SCALARS = ("step", "wall")
"""Keys every record has that place it rather than measure it."""


def scalar_name(phase: str, key: str) -> str:
    """The name a numeric ``key`` of a ``phase`` record is exported under (TensorBoard's tag,
    MLflow's metric): ``<phase>/<key>`` (``train/loss``, ``eval/accuracy``,
    ``system/memory_gb/rank0``), or ``key`` where it is ``epoch`` or already starts with
    ``<phase>/`` (``trust_ratio/conv1/kernel``)."""
    return key if key == "epoch" or key.startswith(f"{phase}/") else f"{phase}/{key}"


def scalars(frame: pd.DataFrame) -> pd.DataFrame:
    """Every numeric value of every record of ``frame`` that has a step, one row each, in
    record order: ``record`` (its row in ``frame``), ``name`` (:func:`scalar_name`; a record
    without a phase is an ``events`` one), ``step`` (an integer), ``wall`` (NaN where the
    record has none) and ``value`` (float64). NaN is left out (a key the record lacks, or a
    diverged loss); ``epoch`` is given once a step, at the step's first record that has it."""
    columns = ["record", "name", "step", "wall", "value"]
    keys = [
        key
        for key in frame.columns
        if key not in NOT_SCALARS and pd.api.types.is_numeric_dtype(frame[key])
    ]
    if "step" not in frame or not keys:
        return pd.DataFrame(columns=columns)
    places = pd.DataFrame(
        {
            "record": np.arange(len(frame)),
            "phase": frame["phase"].fillna("events") if "phase" in frame else "events",
            "step": pd.to_numeric(frame["step"], errors="coerce"),
            "wall": pd.to_numeric(frame["wall"], errors="coerce") if "wall" in frame else np.nan,
        }
    )
    values = frame[keys].astype(np.float64).set_axis(places.index)
    long = pd.concat([places, values], axis=1).melt(
        id_vars=["record", "phase", "step", "wall"], var_name="key", value_name="value"
    )
    long = long[np.isfinite(long["step"]) & long["value"].notna()]
    epochs = long["key"] == "epoch"  # melted key by key: a record's epoch follows the last's
    long = long[~epochs | long["step"].ne(long["step"].where(epochs).shift())]
    long = long.sort_values("record", kind="stable")
    long["name"] = [scalar_name(p, k) for p, k in zip(long["phase"], long["key"], strict=True)]
    return long.astype({"step": np.int64}).reset_index(drop=True)[columns]


class EventWriter:
    """Appends records to an events file, one JSON line per record.

    The file is opened unbuffered in append mode, so each record reaches the operating system
    in one ``write`` call and is visible to readers at once. If the file ends in a torn line
    (a crashed earlier writer), a newline is written first so the next record starts clean. A
    record that cannot be written whole (a full disk) is cut off again, so a failed write
    leaves the file as it was and raises :class:`~toolkit.files.WriteError`.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        with files.writing(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
            self._file = os.fdopen(os.open(self.path, flags, 0o644), "ab", buffering=0)
            if self._file.tell() > 0 and not self._ends_with_newline():
                self._file.write(b"\n")

    def _ends_with_newline(self) -> bool:
        with open(self.path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` (flat: values are numbers, strings, booleans or None).

        Adds ``"wall"`` (``time.time()``) unless the record has it.
        """
        record = {"wall": time.time(), **record}
        line = json.dumps({key: _encode(value) for key, value in record.items()}, allow_nan=False)
        with files.writing(self.path):
            files.append_whole(self._file.fileno(), line.encode() + b"\n")

    def close(self) -> None:
        """Close the file and bring its columnar copy up to date (see the module doc)."""
        self._file.close()
        read_events(self.path)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class EventTail:
    """Reads a growing events file incrementally, for live runs.

    Each :meth:`read_new` returns the records completed since the previous call: it remembers
    the byte offset after the last complete line, so a line still being written is returned by
    a later call. The first call (and any restart) begins with the file's columnar copy, when
    one matches, and parses only the bytes after it. A file that does not exist yet reads as
    empty. If the file was truncated or replaced (a different inode, or shorter than the
    offset), reading starts over from its beginning and :attr:`restarted` is set, so callers can
    drop what they accumulated. (A file truncated and regrown past the offset between two calls
    cannot be told apart.)

    A reader in another process continues where this one stopped from its :meth:`position`
    (``EventTail(path, position)``), tied to the log as the columnar copy is: the same file, at
    least that long, with the same last bytes before the offset; else it starts over, with
    :attr:`restarted` set.
    """

    def __init__(self, path: str | os.PathLike, position: dict | None = None):
        self.path = Path(path)
        self.restarted = False
        self._offset = 0
        self._identity: tuple[int, int] | None = None
        self._parsed = 0  # bytes of complete lines the last call parsed
        self._last = b""  # the last bytes before the offset: what a copy or position ties to
        if position is not None:
            self._identity = (position["device"], position["inode"])
            self._offset, self._last = position["offset"], bytes.fromhex(position["last"])

    def read_new(self) -> pd.DataFrame:
        """Records appended since the last call, as a DataFrame (the union of their keys)."""
        self.restarted = False
        copied = pd.DataFrame()
        try:
            with files.open_regular(self.path) as f:
                stat = os.fstat(f.fileno())
                identity = (stat.st_dev, stat.st_ino)
                moved = identity != self._identity or stat.st_size < self._offset
                if moved or not _ends_with(f, self._offset, self._last):
                    self.restarted = self._identity is not None
                    self._identity, self._offset, self._last = identity, 0, b""
                if self._offset == 0:
                    copied, self._offset = _load_copy(copy_path(self.path), self._origin(), f)
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return pd.DataFrame()
        complete = data.rfind(b"\n") + 1
        self._offset += complete
        self._parsed = complete
        self._last = (self._last + data[:complete])[-_CHECKED_BYTES:]
        new = parse(data[:complete])
        parts = [part for part in (copied, new) if len(part)]
        return pd.concat(parts, ignore_index=True) if len(parts) > 1 else next(iter(parts), new)

    def position(self) -> dict:
        """Where the next read starts, for ``EventTail(path, position)`` (JSON-ready)."""
        return self._origin() | {"offset": self._offset, "last": self._last.hex()}

    def _origin(self) -> dict[str, int]:
        device, inode = self._identity
        return {"device": device, "inode": inode}


def _ends_with(log, offset: int, last: bytes) -> bool:
    """Whether ``log``'s bytes just before ``offset`` are ``last``."""
    log.seek(offset - len(last))
    return log.read(len(last)) == last


def copy_path(path: str | os.PathLike) -> Path:
    """Where the columnar copy of the events file ``path`` lives: ``events.parquet`` beside it."""
    return Path(path).with_suffix(".parquet")


def read_events(path: str | os.PathLike) -> pd.DataFrame:
    """All complete records of an events file (empty DataFrame if the file does not exist),
    through its columnar copy, which is rewritten when :data:`COPY_AFTER` bytes or more were
    parsed past it (see the module doc)."""
    tail = EventTail(path)
    frame = tail.read_new()
    if tail._parsed >= COPY_AFTER:
        _save_copy(copy_path(path), frame, tail.position())
    return frame


def _load_copy(copy: Path, origin: dict, log) -> tuple[pd.DataFrame, int]:
    """The records of the copy and the log offset they reach, if the copy matches ``log``;
    otherwise none and 0."""
    try:
        with files.open_regular(copy) as f:
            table = pq.read_table(f)
        tie = json.loads((table.schema.metadata or {})[_COPY_KEY])
        offset, last = tie["offset"], bytes.fromhex(tie["last"])
        if {k: tie[k] for k in origin} != origin or not _ends_with(log, offset, last):
            return pd.DataFrame(), 0
        return table.to_pandas(split_blocks=True), offset
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return pd.DataFrame(), 0


def _save_copy(copy: Path, frame: pd.DataFrame, tie: dict) -> None:
    """Replace the copy with ``frame``, tied to its log by ``tie``; a failure leaves no copy
    behind but is not an error (the log itself is intact)."""
    try:
        table = pa.Table.from_pandas(frame, preserve_index=False)
        metadata = (table.schema.metadata or {}) | {_COPY_KEY: json.dumps(tie).encode()}
        buffer = pa.BufferOutputStream()
        pq.write_table(table.replace_schema_metadata(metadata), buffer)
        files.replace(copy, buffer.getvalue().to_pybytes())
    except (OSError, ValueError, TypeError, pa.ArrowException):
        return


def diverged(events: pd.DataFrame) -> bool:
    """Whether a run's ``events`` hold a train event whose loss is NaN or infinite."""
    if "phase" not in events or "loss" not in events:
        return False
    losses = pd.to_numeric(events.loc[events["phase"] == "train", "loss"], errors="coerce")
    return not np.isfinite(losses.to_numpy(float)).all()  # every train event has a loss


def truncate_after(path: str | os.PathLike, step: int) -> None:
    """Drop the records after ``step`` (a resumed run rewinds to its checkpoint, so its curve
    continues the original's instead of repeating steps). The file is replaced atomically;
    live readers see a replaced file and start over, and its columnar copy is removed."""
    path = Path(path)
    copy_path(path).unlink(missing_ok=True)
    try:
        data = files.read_bytes(path)
    except FileNotFoundError:
        return
    lines = data.splitlines(keepends=True)
    kept = [line for line in lines if line.endswith(b"\n") and _keep(line, step)]
    files.replace(path, b"".join(kept))


def _keep(line: bytes, step: int) -> bool:
    """Whether a line stays: a record whose step is not after ``step`` (or has no number)."""
    records = _records(line)
    if not records:
        return False
    at = records[0].get("step")
    return not _is_number(at) or at <= step
