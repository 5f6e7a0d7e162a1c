"""A real Slurm on the test cluster (``python -m toolkit cluster up --slurm``).

Debian's Slurm 22.05 and MUNGE (``scripts/setup.sh --test`` installs them), laid over the
namespace hosts of :mod:`toolkit.launching.cluster`:

- one ``munged`` in this machine's own namespace, with a key, socket, pid and seed of its own
  under :data:`STATE` (``--force``: it runs as root). Every host shares the file system, and so
  the socket: one daemon serves them all, as one would on a single-host install;
- ``slurmctld`` in this machine's own namespace, listening on the bridge's address
  (``10.213.0.1``) under this machine's hostname, so the client commands (``sinfo``,
  ``sbatch``, ``squeue``, ``scancel``, ``scontrol``) work here and on every host;
- one ``slurmd`` inside each host (entered as :func:`toolkit.launching.cluster.exec_argv` does),
  registering as that host's name, with its spool, pid and log file named after it (``%n``).

The configuration is written where every Slurm command looks for it, ``/etc/slurm/slurm.conf``
(and ``cgroup.conf``: slurmd 22.05 always initialises a cgroup plugin), marked as the test
cluster's; a configuration this module did not write is never replaced. One partition,
:data:`PARTITION`, holds every node, each with :data:`CPUS_PER_NODE` CPUs (one rank each). Jobs
may be requeued; a cancelled job's processes get :data:`KILL_WAIT_S` seconds between SIGTERM
and SIGKILL. There is no ``slurmdbd``, so ``sacct`` has no data: the lab reads live state from
``squeue`` and ``scontrol``.

:func:`stop` ends every daemon this module started (the hosts' slurmds die with their
namespaces too) and removes its files and the configuration. Slurm is laid over the cluster and
taken off before it: ``cluster up --slurm`` is :func:`toolkit.launching.cluster.up`, then
:func:`start`; ``cluster down`` is :func:`stop`, then :func:`toolkit.launching.cluster.down`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil

from toolkit.launching import cluster

STATE = cluster.STATE / "slurm"
CONF_DIR = Path("/etc/slurm")
MARK = "# Large-Batch Lab's test cluster (python -m toolkit cluster up --slurm); removed by down"
PARTITION = "lab"
CPUS_PER_NODE = 2
KILL_WAIT_S = 5
CRED_EXPIRE_S = 10  # also how long a requeued job waits before it may start again (120 s)
DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "sinfo", "sbatch")
START_TIMEOUT_S = 30.0


def start(hosts: list[cluster.Host]) -> None:
    """Start (or repair) MUNGE, the controller and one slurmd per host in ``hosts``, and wait
    until every node answers ``idle``. Raises :class:`~toolkit.launching.cluster.ClusterError`
    naming what is missing or what did not come up, with the daemon's log."""
    missing = [tool for tool in DAEMONS if shutil.which(tool) is None]
    if missing:
        raise cluster.ClusterError(
            f"missing {', '.join(missing)}: run scripts/setup.sh --test (Debian: apt-get "
            "install slurmctld slurmd slurm-client munge)"
        )
    for directory in ("munge", "ctld", "spool", "log"):
        (STATE / directory).mkdir(parents=True, exist_ok=True)
    _write_config(hosts)
    _munged()
    _daemon("slurmctld", ["/usr/sbin/slurmctld", "-D", "-i"])
    for host in hosts:
        _daemon(
            f"slurmd-{host.name}",
            cluster.exec_argv(host.name, ["/usr/sbin/slurmd", "-D", "-N", host.name]),
        )
    _wait_idle([h.name for h in hosts])


def running() -> bool:
    """Whether this module's controller is up (the cluster was made with ``--slurm``)."""
    return _alive("slurmctld")


def node_states() -> dict[str, str]:
    """Each node's Slurm state as ``sinfo`` gives it (``idle``, ``alloc``, ``down*``, ...);
    empty when the controller does not answer."""
    try:
        answer = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"],
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    states = (line.split() for line in answer.stdout.splitlines() if line.strip())
    return {name: state for name, state in states}


def stop() -> None:
    """End every Slurm and MUNGE daemon this module started and remove their files and the
    configuration it wrote. Safe to run twice."""
    for name in sorted(_pid_files(), reverse=True):  # slurmds, slurmctld, then munged
        _end(name)
    for conf in ("slurm.conf", "cgroup.conf"):
        path = CONF_DIR / conf
        if _ours(path):
            path.unlink()
    shutil.rmtree(STATE, ignore_errors=True)


def slurm_conf(hosts: list[cluster.Host]) -> str:
    """The test cluster's ``slurm.conf`` for ``hosts``."""
    controller = socket.gethostname()
    nodes = [
        f"NodeName={h.name} NodeAddr={h.address} CPUs={CPUS_PER_NODE} State=UNKNOWN" for h in hosts
    ]
    return "\n".join(
        [
            MARK,
            "ClusterName=lbl",
            f"SlurmctldHost={controller}({cluster.SUBNET}.1)",
            "SlurmUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={STATE / 'munge' / 'munge.socket'},cred_expire={CRED_EXPIRE_S}",
            "MpiDefault=none",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "JobRequeue=1",
            f"KillWait={KILL_WAIT_S}",
            "SlurmdTimeout=10",
            "InactiveLimit=0",
            "MinJobAge=600",
            "SchedulerParameters=bf_interval=5",
            f"StateSaveLocation={STATE / 'ctld'}",
            f"SlurmctldPidFile={STATE / 'slurmctld.pid'}",
            f"SlurmctldLogFile={STATE / 'log' / 'slurmctld.log'}",
            f"SlurmdSpoolDir={STATE / 'spool' / '%n'}",
            f"SlurmdPidFile={STATE / 'slurmd-%n.pid'}",
            f"SlurmdLogFile={STATE / 'log' / 'slurmd-%n.log'}",
            *nodes,
            f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


# --- the daemons --------------------------------------------------------------------------


def _write_config(hosts: list[cluster.Host]) -> None:
    """``slurm.conf`` and ``cgroup.conf`` in :data:`CONF_DIR`, refusing to replace a
    configuration this module did not write (a real Slurm's)."""
    CONF_DIR.mkdir(parents=True, exist_ok=True)
    files = {
        "slurm.conf": slurm_conf(hosts),
        "cgroup.conf": f"{MARK}\nCgroupPlugin=cgroup/v1\nCgroupAutomount=no\n",
    }
    for name in files:
        path = CONF_DIR / name
        if path.exists() and not _ours(path):
            raise cluster.ClusterError(
                f"{path} exists and is not the test cluster's: this machine has a Slurm of its "
                "own, which the test cluster will not replace"
            )
    for name, text in files.items():
        (CONF_DIR / name).write_text(text)


def _munged() -> None:
    """The cluster's MUNGE daemon, with a key made once for this cluster."""
    key = STATE / "munge" / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
    munge = STATE / "munge"
    _daemon(
        "munged",
        [
            "/usr/sbin/munged",
            "--foreground",
            "--force",
            f"--key-file={key}",
            f"--socket={munge / 'munge.socket'}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--seed-file={munge / 'munged.seed'}",
            f"--log-file={STATE / 'log' / 'munged.log'}",
        ],
    )


def _daemon(name: str, argv: list[str]) -> None:
    """Start ``argv`` (a daemon kept in the foreground) as ``name``, unless it is running;
    its pid is kept in ``STATE/<name>.lbl-pid`` and its output in ``log/<name>.out``."""
    if _alive(name):
        return
    with open(STATE / "log" / f"{name}.out", "ab") as out:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _pid_file(name).write_text(f"{process.pid} {psutil.Process(process.pid).create_time()}")


def _wait_idle(names: list[str]) -> None:
    """Wait until every node in ``names`` is ``idle`` (or ``mix``/``alloc``: in use)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        states = node_states()
        if all(states.get(n, "").rstrip("*") in ("idle", "mix", "alloc") for n in names):
            if not any(states[n].endswith("*") for n in names):
                return
        if time.monotonic() > deadline:
            logs = "; ".join(_log_tail(p) for p in sorted((STATE / "log").glob("*")))
            raise cluster.ClusterError(
                f"Slurm's nodes did not come up within {START_TIMEOUT_S:.0f} s "
                f"(sinfo: {states or 'no answer'}); {logs}"
            )
        time.sleep(0.3)


def _log_tail(path: Path, lines: int = 3) -> str:
    said = path.read_text(errors="replace").strip().splitlines()[-lines:]
    return f"{path.name}: {' | '.join(said) or '(empty)'}"


def _pid_file(name: str) -> Path:
    return STATE / f"{name}.lbl-pid"


def _pid_files() -> list[str]:
    return [p.name.removesuffix(".lbl-pid") for p in STATE.glob("*.lbl-pid")]


def _process(name: str) -> psutil.Process | None:
    """The live daemon recorded as ``name`` (``None``: none, or its pid was reused)."""
    try:
        pid, started = _pid_file(name).read_text().split()
        process = psutil.Process(int(pid))
        if abs(process.create_time() - float(started)) > 0.05:
            return None
        return None if process.status() == psutil.STATUS_ZOMBIE else process
    except (OSError, ValueError, psutil.Error):
        return None


def _alive(name: str) -> bool:
    return _process(name) is not None


def _end(name: str) -> None:
    """SIGTERM the daemon ``name`` and everything it started, SIGKILL after 5 s."""
    process = _process(name)
    if process is not None:
        try:
            family = [process, *process.children(recursive=True)]
        except psutil.Error:
            family = [process]
        for member in family:
            _signal(member, signal.SIGTERM)
        _, left = psutil.wait_procs(family, timeout=5)
        for member in left:
            _signal(member, signal.SIGKILL)
        psutil.wait_procs(left, timeout=5)
    _pid_file(name).unlink(missing_ok=True)


def _signal(process: psutil.Process, signum: int) -> None:
    try:
        process.send_signal(signum)
    except psutil.Error:
        pass


def _ours(path: Path) -> bool:
    try:
        return path.read_text().startswith(MARK)
    except OSError:
        return False
