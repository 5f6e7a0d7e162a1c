"""How the lab says a count in its sentences: ``1 cell``, ``2 cells``, ``1.5 passes``."""

from __future__ import annotations


def counted(count: float, noun: str) -> str:
    """``count`` and ``noun``, plural unless the count is exactly one (``es`` after a
    hissing end: ``passes``, ``batches``, but ``epochs``)."""
    number = f"{int(count):,}" if float(count).is_integer() else f"{count:g}"
    if count == 1:
        return f"{number} {noun}"
    ending = "es" if noun.endswith(("s", "x", "sh", "tch")) else "s"
    return f"{number} {noun}{ending}"
