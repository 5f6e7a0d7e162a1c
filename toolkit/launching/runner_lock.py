"""One runner per sweep or search and runs root: an exclusive ``flock`` on a file in the runs
root, held for the runner's life. The kernel lets it go when the runner dies, however it dies,
so a killed runner leaves nothing to clean up and the next one starts."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from toolkit import files


@contextmanager
def held(path: Path, refusal: Exception) -> Iterator[None]:
    """Hold the lock ``path`` (made if missing) for the ``with`` block; raise ``refusal`` if
    another process holds it."""
    with files.writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise refusal from None
        yield
    finally:
        os.close(fd)


def is_held(path: Path) -> bool:
    """Whether a live process holds the lock ``path``."""
    if not path.exists():
        return False
    try:
        with held(path, BlockingIOError()):
            return False
    except BlockingIOError:
        return True
