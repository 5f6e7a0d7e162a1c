"""A host list as horovodrun's ``-H`` takes it (``h1:2,h2:2``): the one parser of it, used by
the schema (the config's ``hosts``), its rules (enough slots) and the launcher
(:mod:`toolkit.launching.hosts` turns hostfiles, discovery and Slurm allocations into one).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from toolkit.errors import ConfigError

HOSTS = re.compile(r"^[A-Za-z0-9_.-]+:[1-9][0-9]*(,[A-Za-z0-9_.-]+:[1-9][0-9]*)*$")
"""``name:slots[,name:slots...]``, slots at least 1."""


def parse(hosts: str) -> dict[str, int]:
    """``"h1:2,h2:2"`` as ``{"h1": 2, "h2": 2}``; a host named twice has the sum of its slots.
    Raises :class:`~toolkit.errors.ConfigError` for a malformed list."""
    if not HOSTS.match(hosts):
        raise ConfigError(
            f"hosts must be name:slots[,name:slots...], e.g. h1:2,h2:2 (got {hosts[:200]!r})"
        )
    slots: dict[str, int] = {}
    for item in hosts.split(","):
        name, count = item.rsplit(":", 1)
        slots[name] = slots.get(name, 0) + int(count)
    return slots


def join(slots: Mapping[str, int]) -> str:
    """``{"h1": 2, "h2": 2}`` as ``"h1:2,h2:2"``."""
    return ",".join(f"{name}:{count}" for name, count in slots.items())
