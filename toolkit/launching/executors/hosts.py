"""Hosts over ssh: the local executor's queue, supervisor and horovodrun, with workers on the
hosts the config names (``hosts``, or an elastic run's discovery), reached and ended over ssh
(:mod:`toolkit.launching.remote`); pre-flight checks each host (:mod:`toolkit.launching.preflight`).
"""

from __future__ import annotations

from pathlib import Path

from toolkit import host_list
from toolkit.config import ExperimentConfig
from toolkit.launching import remote
from toolkit.launching.executors.local import LocalExecutor


class HostsExecutor(LocalExecutor):
    """Workers on the config's hosts, or on those an elastic run discovers."""

    kind = "hosts"
    title = "Hosts over ssh"

    @classmethod
    def chosen_by(cls, config: ExperimentConfig) -> bool:
        named = host_list.parse(config.hosts) if config.hosts else {}
        return config.elastic is not None or any(not remote.is_local(host) for host in named)

    def where(self, config: ExperimentConfig, job: str | None = None) -> str:
        if config.elastic is not None:
            elastic = config.elastic
            found = Path(elastic.discovery).name
            return f"hosts {found} finds, {elastic.min_workers}-{elastic.max_workers} workers"
        return f"hosts {config.hosts}"
