"""Reading and writing a run's files so that no file's content or kind can hurt the reader, and
a failed write says which file and why.

Rules:

- Readers open regular files only, never through a symlink (``O_NOFOLLOW``) and never blocking
  (``O_NONBLOCK``: a FIFO in place of a log must not hang the dashboard). Anything else raises
  :class:`OSError` naming the file; a missing file raises :class:`FileNotFoundError` as usual.
- JSON files are replaced atomically (a temporary file renamed over the old one), so a reader
  never sees half of one. If the temporary file cannot be written (a full disk), it is removed
  and the file is overwritten in place instead: a status file must be writable when the disk is
  full, and overwriting a file's existing blocks needs no new space.
- Every write error becomes a :class:`WriteError` whose message names the cause and the file:
  ``no space left on device while writing events.jsonl``.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO


class WriteError(OSError):
    """Writing a run file failed; ``str()`` is ``<cause> while writing <file>``."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


@contextmanager
def writing(path: str | os.PathLike, name: str | None = None) -> Iterator[None]:
    """Turn any :class:`OSError` raised inside into a :class:`WriteError` naming ``name``
    (default: ``path``'s file name)."""
    try:
        yield
    except WriteError:
        raise
    except OSError as error:
        cause = os.strerror(error.errno) if error.errno else str(error)
        message = f"{cause[:1].lower()}{cause[1:]} while writing {name or Path(path).name}"
        raise WriteError(error.errno, message) from error


def open_regular(path: str | os.PathLike, follow: bool = False) -> BinaryIO:
    """Open ``path`` for binary reading if it is a regular file reached without a symlink (with
    ``follow``, a user's own file: through one too). Never blocks (a FIFO is refused)."""
    try:
        nofollow = 0 if follow else os.O_NOFOLLOW
        fd = os.open(path, os.O_RDONLY | nofollow | os.O_NONBLOCK)
    except OSError as error:
        if error.errno == errno.ELOOP:  # the last component is a symlink
            raise OSError(error.errno, f"{Path(path).name} is a symlink (not followed)") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise OSError(f"{Path(path).name} is {kind}")
    return os.fdopen(fd, "rb")


def read_bytes(path: str | os.PathLike, limit: int | None = None, follow: bool = False) -> bytes:
    """The content of a regular file (see :func:`open_regular`); :class:`OSError` if it holds
    more than ``limit`` bytes (read no further)."""
    with open_regular(path, follow) as f:
        data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise OSError(f"{path}: larger than the limit of {limit:,} bytes")
    return data


def tail(path: str | os.PathLike, max_bytes: int = 32_000) -> str:
    """The end of a (possibly large, growing) log file, starting at a line boundary; ``''`` if
    it cannot be read (see :func:`open_regular`)."""
    try:
        with open_regular(path) as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except OSError:
        return ""
    if size > max_bytes:
        data = data[data.find(b"\n") + 1 :]
    return data.decode("utf-8", errors="replace")


def read_json(path: str | os.PathLike) -> Any:
    """The JSON value in ``path``; raises :class:`OSError` or :class:`ValueError` (not JSON)."""
    return json.loads(read_bytes(path))


def replace(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically: a reader sees the old or the new content, and
    a symlink at ``path`` is replaced, never written through. The temporary file is removed if
    anything fails."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_native_id()}.tmp")
    with writing(path):
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


def write_json(path: str | os.PathLike, data: dict[str, Any]) -> None:
    """Replace ``path`` with ``data`` as JSON: atomically, or in place when the disk is full."""
    path = Path(path)
    text = json.dumps(data, indent=2, default=str).encode()
    try:
        replace(path, text)
    except WriteError:
        if not path.is_file() or path.is_symlink():
            raise
        with writing(path):
            _overwrite(path, text)


def append_whole(fd: int, data: bytes) -> None:
    """Append ``data`` to the file open as ``fd`` (``O_APPEND``), all of it or none: a short
    write (the disk filled up midway) is continued, and if that fails the file is truncated
    back to its old end before the error is raised."""
    end = os.fstat(fd).st_size
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            if written == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            view = view[written:]
    except OSError:
        os.ftruncate(fd, end)
        raise


def _overwrite(path: Path, text: bytes) -> None:
    """Write ``text`` over ``path``'s existing bytes, padded with spaces (still valid JSON) to
    the old length so that no new space is needed when the new text is shorter."""
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        old_size = os.fstat(fd).st_size
        os.write(fd, text.ljust(old_size))
    finally:
        os.close(fd)
