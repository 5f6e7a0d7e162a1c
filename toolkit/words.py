"""How the lab says a count in its sentences: ``1 cell``, ``2 cells``, ``1,000 cells``."""

from __future__ import annotations


def counted(count: float, noun: str) -> str:
    """``count`` and ``noun``, plural (an ``s``) unless the count is exactly one."""
    return f"{count:,g} {noun}{'s' * (count != 1)}"
