"""Pre-flight for a run on several hosts: every check runs before any run directory exists.

For each host of the run's host list that is not this machine, all at once, over ssh with the
run's options (:class:`toolkit.launching.remote.Ssh`):

- it answers ssh within :data:`~toolkit.launching.remote.CONNECT_TIMEOUT_S` seconds;
- it has this Python at the same path, this repository at the same path and the same toolkit
  version (horovodrun starts every worker with the launcher's interpreter and working
  directory);
- it has the network interface the workers will talk over, where one is named
  (:func:`toolkit.launching.remote.network_interface`);
- it sees the runs root: a file written here is read there, because rank 0 writes events,
  checkpoints and the status into the shared run directory and the others read checkpoints
  back from it on resume;
- the workers asked of it fit its slots: the queue's capacity for it where one is set
  (``python -m toolkit queue --capacity``), else its GPUs, else its CPU cores.

Every problem found is reported at once, one line per host, as a
:class:`~toolkit.config.ConfigError` (so the CLI exits 2); horovodrun's own failure here would
be a minute's wait and a stack trace.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import toolkit
from toolkit.config import ConfigError, ExperimentConfig
from toolkit.files import writing
from toolkit.launching import remote, slots
from toolkit.launching.remote import PACKAGE_ROOT, Ssh

PROBE = """
import json, os, socket, sys
package_root, runs_root, name, token, version = sys.argv[1:]
found = {"hostname": socket.gethostname(), "repository": os.path.isdir(package_root)}
try:
    with open(os.path.join(runs_root, name)) as handle:
        found["shared"] = handle.read() == token
except OSError:
    found["shared"] = False
try:
    import psutil
    found["interfaces"] = sorted(psutil.net_if_addrs())
except Exception:
    found["interfaces"] = None
try:
    import toolkit
    from toolkit.launching.slots import local_slots
    found["version"], found["slots"] = toolkit.__version__, local_slots()
except Exception as error:
    found["version"], found["slots"] = None, None
print(json.dumps(found))
"""
TIMEOUT_S = 30.0


def check(config: ExperimentConfig, runs_root: Path) -> None:
    """Raise :class:`ConfigError` naming each host of ``config`` that cannot take its workers
    (see the module's rules); nothing is checked for a run on this machine alone."""
    wanted = {h: n for h, n in slots.slots_of(config).items() if not remote.is_local(h)}
    if not wanted:
        return
    ssh, capacity = Ssh.of(config), slots.capacity(runs_root)
    interface = remote.network_interface(config)
    interfaces = interface.split(",") if interface else []
    token, name = secrets.token_hex(16), f".preflight-{secrets.token_hex(4)}"
    marker = runs_root / name
    with writing(runs_root):
        runs_root.mkdir(parents=True, exist_ok=True)
        marker.write_text(token)
    try:
        with ThreadPoolExecutor(max_workers=min(len(wanted), 32)) as pool:
            found = pool.map(
                lambda host: _problem(
                    host, wanted[host], capacity.get(host), interfaces, ssh, marker, token
                ),
                wanted,
            )
            problems = [
                f"{host}: {problem}" for host, problem in zip(wanted, found, strict=True) if problem
            ]
    finally:
        marker.unlink(missing_ok=True)
    if problems:
        raise ConfigError("pre-flight failed, nothing was started:\n  " + "\n  ".join(problems))


def _problem(
    host: str,
    need: int,
    capacity: int | None,
    interfaces: list[str],
    ssh: Ssh,
    marker: Path,
    token: str,
) -> str | None:
    """What stops ``host`` from taking ``need`` workers over ``interfaces``, or ``None``."""
    args = ["-c", PROBE, str(PACKAGE_ROOT), str(marker.parent), marker.name, token]
    try:
        answer = ssh.python(host, [*args, toolkit.__version__], timeout_s=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"ssh did not finish within {TIMEOUT_S:.0f} s"
    if answer.returncode == 255:  # ssh's own failure: no answer, refused, or no key
        said = answer.stderr.strip().splitlines()
        return f"does not answer ssh ({said[-1][:300] if said else 'no reason given'})"
    if answer.returncode == 127:
        return (
            f"has no {sys.executable}: the repository and its .venv must be at the "
            "same path on every host"
        )
    try:
        found = json.loads(answer.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"the check failed there (exit {answer.returncode}): {answer.stderr[-300:]}"
    if not found["repository"] or found["version"] is None:
        return f"has no repository at {PACKAGE_ROOT} (it must be at the same path on every host)"
    if found["version"] != toolkit.__version__:
        return f"runs toolkit {found['version']}, this machine {toolkit.__version__}"
    if not found["shared"]:
        return (
            f"does not see the runs root {marker.parent} that this machine writes: a "
            "multi-host run needs it on a shared filesystem (NFS, a shared home)"
        )
    missing = [name for name in interfaces if name not in (found["interfaces"] or [])]
    if missing:
        return (
            f"has no network interface {', '.join(missing)} (the workers talk over it): set "
            f"network_interface to one it has (it has {', '.join(found['interfaces'] or [])})"
        )
    have, why = (capacity, "its queue capacity") if capacity else (found["slots"], "its cores")
    if need > have:
        return (
            f"{need} workers asked of it, but it has {have} slots ({why}; "
            f"python -m toolkit queue --capacity {host}:{need} allows more)"
        )
    return None
