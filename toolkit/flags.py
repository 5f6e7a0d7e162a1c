"""What the CLI's flags accept: argparse types that apply the rule the config, or the function
called, applies to the same value, so a bad flag exits 2 naming itself and the allowed values
before anything starts."""

from __future__ import annotations

import argparse
import math

from toolkit import safe_yaml


def positive(text: str) -> float:
    """An argparse type: a finite number above 0 (a rate factor, a loss)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number > 0 (got {safe_yaml.short(text)})")
    return value


def integer(low: int, high: int | None = None):
    """An argparse type: an integer from ``low`` (to ``high``), the rule the config or the
    function called applies to the same value; anything else exits 2 naming the argument
    and the range."""
    allowed = f"an integer from {low} to {high}" if high is not None else f"an integer >= {low}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {allowed} (got {safe_yaml.short(text)})")
        return value

    return parse
