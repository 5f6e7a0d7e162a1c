"""Commands on other hosts over ssh: how pre-flight and ``stop`` reach a run's hosts.

A run reaches its hosts with the ssh options its config gives horovodrun (``ssh_port``,
``ssh_identity_file``), never prompting (``BatchMode``), with a connect timeout, accepting a
host key seen for the first time but never a changed one. The remote side runs this
package's own Python, at the same path: a multi-host run needs the repository and its
``.venv`` at the same place on every host, which pre-flight checks first.
"""

from __future__ import annotations

import functools
import shlex
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

from toolkit import host_list

CONNECT_TIMEOUT_S = 5
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the checkout that holds toolkit/


@dataclass(frozen=True)
class Ssh:
    """ssh options: ``port``, ``identity_file``; ``connect_timeout_s`` bounds the handshake."""

    port: int | None = None
    identity_file: str | None = None
    connect_timeout_s: int = CONNECT_TIMEOUT_S

    @classmethod
    def of(cls, config) -> Ssh:
        """The options of an :class:`~toolkit.config.ExperimentConfig`."""
        return cls(config.ssh_port, config.ssh_identity_file)

    def argv(self, host: str, command: list[str]) -> list[str]:
        """The ssh command line that runs ``command`` (quoted for the remote shell) on
        ``host``."""
        options = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout_s}"]
        options += ["-o", "StrictHostKeyChecking=accept-new"]
        options += ["-p", str(self.port)] if self.port else []
        options += ["-i", self.identity_file] if self.identity_file else []
        return ["ssh", *options, host, "--", shlex.join(command)]

    def python(
        self, host: str, args: list[str], stdin: str = "", timeout_s: float = 30.0
    ) -> subprocess.CompletedProcess:
        """Run this Python with ``args`` on ``host``, the package importable; raises
        :class:`subprocess.TimeoutExpired` after ``timeout_s``."""
        command = ["env", f"PYTHONPATH={PACKAGE_ROOT}", sys.executable, *args]
        return subprocess.run(
            self.argv(host, command),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )


def is_local(host: str) -> bool:
    """Whether ``host`` names this machine: ``localhost``, its hostname, or a name that
    resolves to one of its addresses (horovodrun's rule: such a host is started without ssh)."""
    if host in ("localhost", socket.gethostname()):
        return True
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return False
    return address.startswith("127.") or address in _local_addresses()


def network_interface(config) -> str | None:
    """The interfaces horovodrun is told to use for ``config``: its ``network_interface``,
    else, for a run whose workers are all on one other host, the interface this machine reaches
    that host through.

    Why the second: horovodrun keeps the interfaces on which each host reaches the next in a
    ring of the run's hosts. With one host the ring is that host alone, which reaches itself on
    loopback too, so ``lo`` is kept, and the rendezvous address is taken from the first
    interface of a set: ``127.0.0.1`` about half the time, where the workers find nothing
    (``HTTP request failed``)."""
    if config.network_interface:
        return config.network_interface
    names = list(host_list.parse(config.hosts)) if config.hosts else ["localhost"]
    if len(names) != 1 or is_local(names[0]):
        return None
    return interface_towards(names[0])


def interface_towards(host: str) -> str | None:
    """The name of this machine's interface whose address it reaches ``host`` from (``None``
    if ``host`` does not resolve or no route leads there)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((socket.gethostbyname(host), 9))  # a route lookup: nothing is sent
            address = probe.getsockname()[0]
    except OSError:
        return None
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addresses):
            return name
    return None


@functools.cache
def _local_addresses() -> frozenset[str]:
    return frozenset(
        a.address
        for nic in psutil.net_if_addrs().values()
        for a in nic
        if a.family == socket.AF_INET
    )
