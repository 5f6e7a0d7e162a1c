"""Host lists: where a run's workers go, as horovodrun's ``-H`` takes it (``h1:2,h2:2``).

Three ways to give one, all turned into that string before anything starts:

- written out: ``--hosts lbl-h1:2,lbl-h2:2`` (or the config's ``hosts``);
- a hostfile in horovodrun's format (``--hostfile FILE``): one host a line, ``name slots=N``
  (``slots`` defaults to 1), ``#`` starts a comment;
- an elastic run's ``discovery`` (:func:`discover`): a hosts file of ``name:slots`` lines, or an
  executable script that prints them, read again while the run trains;
- ``--hosts auto`` inside a Slurm allocation: the nodes of ``SLURM_JOB_NODELIST`` (Slurm's
  hostlist syntax, ``node[1-3,5]``, expanded by python-hostlist) with the tasks of
  ``SLURM_TASKS_PER_NODE`` (``2(x3),1``) as their slots.

A malformed list raises :class:`~toolkit.config.ConfigError` naming where it came from.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path

import hostlist

from toolkit import files
from toolkit.errors import ConfigError
from toolkit.host_list import join, parse

AUTO = "auto"
HOSTFILE_LINE = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)(\s+slots\s*=\s*(?P<slots>[1-9][0-9]*))?$")
MAX_HOSTFILE_BYTES = 1 << 20


def read_hostfile(path: str | Path) -> str:
    """The host list of a horovodrun hostfile."""
    path = Path(path)
    try:
        lines = files.read_bytes(path, MAX_HOSTFILE_BYTES, follow=True).decode().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"hostfile {path}: cannot be read ({error})") from None
    slots: dict[str, int] = {}
    for number, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = HOSTFILE_LINE.match(line)
        if not match:
            raise ConfigError(
                f"hostfile {path}, line {number}: expected 'name slots=N' with N >= 1 "
                f"(got {line[:200]!r})"
            )
        name, count = match["name"], int(match["slots"] or 1)
        slots[name] = slots.get(name, 0) + count
    if not slots:
        raise ConfigError(f"hostfile {path} lists no host")
    return join(slots)


def is_script(discovery: str | Path) -> bool:
    """Whether an elastic run's ``discovery`` is a script to run (an executable file), rather
    than a hosts file to read."""
    path = Path(discovery)
    return path.is_file() and os.access(path, os.X_OK)


def discover(discovery: str | Path, timeout: float = 30) -> str:
    """The host list an elastic run's ``discovery`` gives now: the lines of its hosts file, or
    of its script's output, each ``name:slots`` or ``name`` (one slot), as Horovod's
    ``--host-discovery-script`` reads them."""
    path = Path(discovery)
    try:
        if is_script(path):
            text = _output(path, timeout).decode()
        else:
            text = files.read_bytes(path, MAX_HOSTFILE_BYTES, follow=True).decode()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"elastic.discovery: {path}: cannot be read ({error})") from None
    listed = [line.strip() for line in text.splitlines() if line.strip()]
    items = [line if ":" in line else f"{line}:1" for line in listed]
    if not items:
        raise ConfigError(f"elastic.discovery: {path} lists no host")
    try:
        return join(parse(",".join(items)))
    except ConfigError as error:
        raise ConfigError(f"elastic.discovery: {path}: {error}") from None


def _output(script: Path, timeout: float) -> bytes:
    """What ``script`` prints, if it exits with 0 within ``timeout`` s having printed at most
    :data:`MAX_HOSTFILE_BYTES` (else ``OSError``: a script that never ends, or never stops
    printing, is cut off)."""
    with subprocess.Popen(
        [str(script.resolve())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its children hold the pipe too: they are ended with it
    ) as child:

        def end() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)

        timer = threading.Timer(timeout, end)
        timer.start()
        try:
            out = child.stdout.read(MAX_HOSTFILE_BYTES + 1)
            if len(out) > MAX_HOSTFILE_BYTES:
                end()
            code = child.wait()
        finally:
            timer.cancel()
    if len(out) > MAX_HOSTFILE_BYTES:
        raise OSError(f"printed more than {MAX_HOSTFILE_BYTES:,} bytes")
    if code:
        raise OSError(f"exited with code {code}" + (" (killed)" if code < 0 else ""))
    return out


def from_slurm(environ: Mapping[str, str] = os.environ) -> str:
    """The host list of the Slurm allocation described by ``environ``."""
    nodes, tasks = environ.get("SLURM_JOB_NODELIST"), environ.get("SLURM_TASKS_PER_NODE")
    if not nodes or not tasks:
        raise ConfigError(
            "--hosts auto needs a Slurm allocation (SLURM_JOB_NODELIST and "
            "SLURM_TASKS_PER_NODE are not both set)"
        )
    try:
        names = hostlist.expand_hostlist(nodes)
        counts = hostlist.parse_slurm_tasks_per_node(tasks)
    except (hostlist.BadHostlist, ValueError) as error:
        raise ConfigError(f"Slurm allocation {nodes[:200]!r} / {tasks[:200]!r}: {error}") from None
    if len(names) != len(counts):
        raise ConfigError(
            f"SLURM_JOB_NODELIST names {len(names)} nodes but SLURM_TASKS_PER_NODE gives "
            f"{len(counts)} counts"
        )
    return join(dict(zip(names, counts, strict=True)))


def resolve(hosts: str | None = None, hostfile: str | Path | None = None) -> str | None:
    """The host list from ``hosts`` (a list or ``auto``) or ``hostfile``, not both."""
    if hosts is not None and hostfile is not None:
        raise ConfigError("give --hosts or --hostfile, not both")
    if hostfile is not None:
        return read_hostfile(hostfile)
    return from_slurm() if hosts == AUTO else hosts
