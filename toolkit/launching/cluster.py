"""A test cluster on one machine: hosts made of Linux network and UTS namespaces, reached by ssh.

``python -m toolkit cluster up`` makes ``N`` hosts (default 3), ``lbl-h1`` ... ``lbl-hN``. Each is

- a network namespace ``lbl-hK`` with one interface, :data:`INTERFACE`, at ``10.213.0.1K``
  on a bridge in this machine's own namespace (which is named :data:`INTERFACE` too, at
  ``10.213.0.1``). Horovod needs the same interface name on every host, the launching one
  included (it looks up its own address on the interface the workers share), so a launcher
  in the root namespace works as well as one inside a host;
- a UTS namespace with the host's own hostname, held by the host's ``sshd`` (Debian's
  ``openssh-server``): everything that logs in over ssh, or enters with :func:`exec_argv`,
  sees that hostname;
- an ``sshd`` listening on the host's address, which accepts the cluster's own key;
- its own share of this machine's cores, as the CPU affinity of everything it runs
  (:func:`cores_of`): a real host has CPUs of its own, and workers that size their thread
  pools by their host's cores (PyTorch's, :mod:`toolkit.parallel.distributed`) would otherwise
  take every core each.

The filesystem is shared, as on a cluster with a shared home or NFS: the same repository,
``.venv`` and runs root on every host. Names resolve through a marked block in ``/etc/hosts``
and ssh finds the key through ``/etc/ssh/ssh_config.d/lbl-cluster.conf``, so ``ssh lbl-h2``
works from this machine and from every host without a password. Keys, ssh configs and the
cluster's description live in :data:`STATE`.

``shape`` limits every host's link to a bandwidth in each direction with ``tc`` (``tbf`` on
both ends of its veth pair) and, where the kernel has ``sch_netem``, adds a one-way delay.

``down`` ends every process in the hosts' namespaces and removes every namespace, link and
file ``up`` made; it is safe to run twice. Namespaces need root: where they cannot be made,
:class:`ClusterError` says what is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

PREFIX = "lbl-h"
INTERFACE = "lbl0"
SUBNET = "10.213.0"
STATE = Path(os.environ.get("LBL_CLUSTER_STATE", "/run/lbl-cluster"))
ETC_HOSTS = Path("/etc/hosts")
SSH_CLIENT_CONFIG = Path("/etc/ssh/ssh_config.d/lbl-cluster.conf")
MARK_BEGIN, MARK_END = "# lbl-cluster begin", "# lbl-cluster end"
RATE = re.compile(r"^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit|tbit)$")
DELAY = re.compile(r"^[0-9]+(\.[0-9]+)?(us|ms|s)$")
MAX_HOSTS = 50
TOOLS = ("ip", "tc", "nsenter", "unshare", "taskset", "ssh", "ssh-keygen", "/usr/sbin/sshd")


class ClusterError(RuntimeError):
    """The cluster cannot be made, reached or changed; the message says what is missing."""


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    sshd_pid: int | None = None


@dataclass(frozen=True)
class Shaping:
    """A link limit: ``bandwidth`` in tc's units (``1gbit``), ``delay`` one way (``100us``)."""

    bandwidth: str | None = None
    delay: str | None = None

    def __post_init__(self):
        if self.bandwidth is not None and not RATE.match(self.bandwidth):
            raise ClusterError(
                f"--bandwidth must look like 1gbit or 500mbit (got {self.bandwidth!r})"
            )
        if self.delay is not None and not DELAY.match(self.delay):
            raise ClusterError(f"--delay must look like 100us or 2ms (got {self.delay!r})")


def host_name(index: int) -> str:
    return f"{PREFIX}{index}"


def up(hosts: int = 3, shaping: Shaping | None = None) -> list[Host]:
    """Make (or repair) a cluster of ``hosts`` hosts and shape its links (``None``: as they
    were, unshaped for a new cluster); returns the hosts. A cluster of another size that is
    already up is refused: ``down`` it first."""
    if not isinstance(hosts, int) or not 1 <= hosts <= MAX_HOSTS:
        raise ClusterError(f"--hosts must be between 1 and {MAX_HOSTS} (got {hosts!r})")
    check_requirements()
    existing = describe()
    if existing and len(existing["hosts"]) != hosts:
        raise ClusterError(
            f"a cluster of {len(existing['hosts'])} hosts is up: "
            "`python -m toolkit cluster down` first"
        )
    STATE.mkdir(parents=True, exist_ok=True)
    _keys()
    _bridge()
    made = [_host(index, cores_of(index, hosts)) for index in range(1, hosts + 1)]
    _write_names(made)
    kept = (existing or {}).get("shaping") or {}
    _describe(made, kept)
    shape(shaping or Shaping(**kept))
    _wait_for_ssh(made)
    return made


def check_requirements() -> None:
    """Raise :class:`ClusterError` naming what this machine lacks to make namespaces."""
    if os.geteuid() != 0:
        raise ClusterError("the test cluster needs root (network namespaces, a bridge, sshd)")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise ClusterError(
            f"missing {', '.join(missing)}: run scripts/setup.sh (Debian: apt-get install "
            "iproute2 util-linux openssh-server openssh-client)"
        )
    probe = f"{PREFIX}probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        raise ClusterError(
            "cannot create a network namespace here (`ip netns add` said: "
            f"{made.stderr.strip()}); the cluster needs CAP_SYS_ADMIN and a kernel with "
            "network namespaces"
        )
    _ip("netns", "del", probe, check=False)


def shape(shaping: Shaping) -> None:
    """Limit every host's link to ``shaping`` in both directions (``Shaping()``: no limit)."""
    description = describe()
    if not description:
        raise ClusterError("no cluster is up: `python -m toolkit cluster up` first")
    for host in description["hosts"]:
        name = host["name"]
        for netns, device in ((name, INTERFACE), (None, name)):  # host's side, bridge's side
            if shaping.bandwidth or shaping.delay:  # replace: a refused qdisc keeps the old
                _tc(netns, "qdisc", "replace", "dev", device, "root", *_qdisc(shaping))
            else:
                _tc(netns, "qdisc", "del", "dev", device, "root", check=False)
    description["shaping"] = asdict(shaping)
    _write_json(STATE / "cluster.json", description)


def _qdisc(shaping: Shaping) -> list[str]:
    """tc's qdisc for ``shaping``: ``netem`` for a delay (with its rate), else ``tbf``."""
    if shaping.delay:
        rate = ["rate", shaping.bandwidth] if shaping.bandwidth else []
        return ["netem", "delay", shaping.delay, *rate, "limit", "100000"]
    # A burst of 4 ms at the rate (at least 64 KiB) is enough for any kernel timer frequency.
    burst = max(64 * 1024, int(_bits_per_second(shaping.bandwidth) / 8 * 0.004))
    return ["tbf", "rate", shaping.bandwidth, "burst", str(burst), "latency", "50ms"]


def _bits_per_second(rate: str) -> float:
    unit = RATE.match(rate).group(2)
    scale = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}[unit]
    return float(rate.removesuffix(unit)) * scale


def describe() -> dict | None:
    """The cluster as ``up`` recorded it (``hosts``, ``shaping``), or ``None`` if none is up."""
    try:
        return json.loads((STATE / "cluster.json").read_text())
    except (OSError, ValueError):
        return None


def links() -> str:
    """The cluster's links in words, for a benchmark's header: ``links 1gbit, 100us one
    way`` or ``links unshaped``."""
    shaping = (describe() or {}).get("shaping") or {}
    limits = [shaping[k] for k in ("bandwidth",) if shaping.get(k)]
    limits += [f"{shaping['delay']} one way"] if shaping.get("delay") else []
    return f"links {', '.join(limits) or 'unshaped'}"


def hosts() -> list[Host]:
    """The cluster's hosts (empty if none is up)."""
    return [Host(**h) for h in (describe() or {}).get("hosts", [])]


def status() -> list[dict]:
    """One row per host: its address, whether its namespace exists, its sshd runs and ``ssh``
    to it answers with its hostname, and its link's shaping."""
    description = describe() or {"hosts": [], "shaping": {}}
    namespaces = set(_namespaces())
    shaping = description.get("shaping") or {}
    rows = []
    for host in map(lambda h: Host(**h), description["hosts"]):
        answer = subprocess.run(
            ["ssh", "-o", "ConnectTimeout=3", host.name, "hostname"],
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
        )
        rows.append(
            {
                "host": host.name,
                "address": host.address,
                "namespace": host.name in namespaces,
                "sshd": _sshd_alive(host),
                "ssh": answer.stdout.strip() == host.name,
                "bandwidth": shaping.get("bandwidth") or "-",
                "delay": shaping.get("delay") or "-",
            }
        )
    return rows


def exec_argv(name: str, argv: list[str]) -> list[str]:
    """The command line that runs ``argv`` inside host ``name``: in its network namespace and
    with its hostname, as a process started there by its sshd would be."""
    host = next((h for h in hosts() if h.name == name), None)
    if host is None:
        known = ", ".join(h.name for h in hosts()) or "none: `python -m toolkit cluster up`"
        raise ClusterError(f"no cluster host {name!r} (hosts: {known})")
    if not _sshd_alive(host):
        raise ClusterError(f"{name}'s sshd is not running (`python -m toolkit cluster up`)")
    enter = ["nsenter", "--target", str(host.sshd_pid), "--uts", "--"]
    cores = ",".join(map(str, psutil.Process(host.sshd_pid).cpu_affinity()))
    return ["ip", "netns", "exec", name, *enter, "taskset", "-c", cores, *argv]


def down() -> None:
    """End every process in the cluster's namespaces, then remove the namespaces, the bridge,
    the names, the ssh config and :data:`STATE`. Safe to run twice, and on a half-made
    cluster."""
    for name in _namespaces():
        _end_processes(name)
        _ip("link", "del", name, check=False)  # the root end of its veth: the kernel frees a
        _ip("netns", "del", name, check=False)  # deleted namespace's devices only later
    _ip("link", "del", INTERFACE, check=False)
    _rewrite_marked(ETC_HOSTS, [])
    SSH_CLIENT_CONFIG.unlink(missing_ok=True)
    shutil.rmtree(STATE, ignore_errors=True)


# --- making it ----------------------------------------------------------------------------


def _keys() -> None:
    """The cluster's client key (authorised on every host) and its hosts' key."""
    for key in ("id_ed25519", "ssh_host_ed25519_key"):
        if not (STATE / key).exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(STATE / key)])
    shutil.copyfile(STATE / "id_ed25519.pub", STATE / "authorized_keys")
    (STATE / "sshd_config").write_text(
        "\n".join(
            [
                f"HostKey {STATE / 'ssh_host_ed25519_key'}",
                f"AuthorizedKeysFile {STATE / 'authorized_keys'}",
                "PidFile none",
                "UsePAM no",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                "StrictModes no",
                "PrintMotd no",
                "MaxStartups 200",  # Horovod opens one session per worker and check at once
                "MaxSessions 200",
                "LogLevel ERROR",
                "",
            ]
        )
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory


def _bridge() -> None:
    if _ip("link", "show", INTERFACE, check=False).returncode != 0:
        _ip("link", "add", INTERFACE, "type", "bridge")
        _ip("addr", "add", f"{SUBNET}.1/24", "dev", INTERFACE)
    _ip("link", "set", INTERFACE, "up")


def cores_of(index: int, hosts: int) -> list[int]:
    """The cores host ``index`` (from 1) of ``hosts`` runs on: an equal share of this
    machine's, in order (on 2 cores, one each; hosts beyond the cores share them in turn)."""
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // hosts)
    first = (index - 1) * share % len(cores)
    return cores[first : first + share]


def _host(index: int, cores: list[int]) -> Host:
    """Host ``index``'s namespace, link and sshd (on ``cores``), each made only if missing."""
    name, address = host_name(index), f"{SUBNET}.{10 + index}"
    if name not in _namespaces():
        _ip("netns", "add", name)
        _ip("link", "add", name, "type", "veth", "peer", "name", INTERFACE, "netns", name)
        _ip("link", "set", name, "master", INTERFACE, "up")
        inside = ["ip", "netns", "exec", name, "ip"]
        _run([*inside, "addr", "add", f"{address}/24", "dev", INTERFACE])
        _run([*inside, "link", "set", INTERFACE, "up"])
        _run([*inside, "link", "set", "lo", "up"])
        _run([*inside, "route", "add", "default", "via", f"{SUBNET}.1"])
    previous = next((h for h in hosts() if h.name == name), None)
    if previous and _sshd_alive(previous):
        return previous
    script = 'hostname "$0" && exec /usr/sbin/sshd -D -f "$1" -o ListenAddress="$2"'
    argv = ["ip", "netns", "exec", name, "unshare", "--uts", "sh", "-c", script]
    with open(STATE / f"{name}.sshd.log", "ab") as log:
        sshd = subprocess.Popen(  # ip, unshare and sh exec: this pid is sshd's
            [*argv, name, str(STATE / "sshd_config"), address],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )
    psutil.Process(sshd.pid).cpu_affinity(cores)  # before anyone logs in: sessions inherit it
    return Host(name, address, sshd.pid)


def _write_names(made: list[Host]) -> None:
    """Names in ``/etc/hosts``, ssh's config for them and their hosts' key as known.

    The config sends a keepalive every 2 s and gives a session up after 3 unanswered, so a
    host that vanishes (its link cut: no TCP reset reaches anyone) ends every ssh session to
    it within about 6 s. horovodrun's elastic driver learns of a lost worker only when its
    ssh session ends; without the keepalives it waited on it for minutes, and the survivors'
    reset with it."""
    _rewrite_marked(ETC_HOSTS, [f"{h.address} {h.name}" for h in made])
    public = (STATE / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    known = [f"{h.name},{h.address} {' '.join(public)}" for h in made]
    (STATE / "known_hosts").write_text("\n".join(known) + "\n")
    SSH_CLIENT_CONFIG.parent.mkdir(parents=True, exist_ok=True)
    SSH_CLIENT_CONFIG.write_text(
        f"# Large-Batch Lab's test cluster (python -m toolkit cluster); removed by `down`.\n"
        f"Host {PREFIX}*\n"
        f"  IdentityFile {STATE / 'id_ed25519'}\n"
        f"  UserKnownHostsFile {STATE / 'known_hosts'}\n"
        "  BatchMode yes\n"
        "  ConnectTimeout 5\n"
        "  ServerAliveInterval 2\n"
        "  ServerAliveCountMax 3\n"
        "  LogLevel ERROR\n"
    )


def _describe(made: list[Host], shaping: dict) -> None:
    _write_json(STATE / "cluster.json", {"hosts": [asdict(h) for h in made], "shaping": shaping})


def _wait_for_ssh(made: list[Host], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    for host in made:
        while True:
            answer = subprocess.run(
                ["ssh", "-o", "ConnectTimeout=2", host.name, "hostname"],
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
            )
            if answer.stdout.strip() == host.name:
                break
            if time.monotonic() > deadline:
                log = (STATE / f"{host.name}.sshd.log").read_text(errors="replace").strip()
                raise ClusterError(
                    f"ssh {host.name} did not answer within {timeout_s:.0f} s: "
                    f"{answer.stderr.strip() or answer.stdout.strip()} {log}".strip()
                )
            time.sleep(0.2)


# --- helpers ------------------------------------------------------------------------------


def _namespaces() -> list[str]:
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    names = [line.split()[0] for line in listed if line.strip()]
    return [n for n in names if re.fullmatch(rf"{PREFIX}[0-9]+", n)]


def _sshd_alive(host: Host) -> bool:
    try:
        process = psutil.Process(host.sshd_pid)
        return process.name() == "sshd" and process.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, TypeError, ValueError):
        return False


def _end_processes(namespace: str) -> None:
    """SIGKILL every process in ``namespace`` (sshd, its sessions, workers, supervisors)."""
    for _ in range(10):
        pids = [int(p) for p in _ip("netns", "pids", namespace, check=False).stdout.split()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        psutil.wait_procs([p for p in map(_process, pids) if p], timeout=5)


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def _rewrite_marked(path: Path, lines: list[str]) -> None:
    """Replace the marked block in ``path`` with ``lines`` (none: remove it), in place (the file
    may be a bind mount, which a rename would not replace)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        text = ""
    kept = re.sub(rf"{re.escape(MARK_BEGIN)}\n.*?{re.escape(MARK_END)}\n", "", text, flags=re.S)
    block = f"{MARK_BEGIN}\n" + "".join(f"{line}\n" for line in lines) + f"{MARK_END}\n"
    new = kept + (block if lines else "")
    if new != text:
        with open(path, "w") as handle:
            handle.write(new)


def _write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=1))


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run(["ip", *args], check=check)


def _tc(netns: str | None, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    result = _run([*prefix, "tc", *args], check=False)
    if check and result.returncode != 0:
        problem = result.stderr.strip()
        if "netem" in args and "unknown" in problem:
            raise ClusterError(
                "this kernel has no netem qdisc (sch_netem), so --delay cannot be set here; "
                "--bandwidth alone works (tbf)"
            )
        raise ClusterError(f"tc {' '.join(args)}: {problem}")
    return result


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise ClusterError(f"{' '.join(argv)}: {result.stderr.strip() or 'failed'}")
    return result
