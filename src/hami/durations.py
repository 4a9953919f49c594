"""Durations on the command line: every ``hami`` command takes a Go duration (``15s``,
``5m``, ``1h30m``, ``500ms``) or a plain number of seconds (``30``, ``30.0``) wherever
it asks for a time."""

from __future__ import annotations

import re
from datetime import timedelta

_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?)(ms|us|µs|ns|h|m|s)")


def parse_duration(text: str) -> timedelta:
    """``"15s"``, ``"1h30m"``, ``"250ms"``, ``"0"`` or seconds as a number (``"30.0"``).

    Raises:
        ValueError: neither (negative numbers included), with a message saying what is
            expected.
    """
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        parts = _PART.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise ValueError(f"{text!r} is not a duration: give e.g. 15s, 5m, 1h30m, 500ms "
                             "or a number of seconds") from None
        return timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in parts))
    if seconds < 0 or seconds != seconds or seconds == float("inf"):
        raise ValueError(f"{text!r} is not a duration: it must be 0 or more seconds")
    return timedelta(seconds=seconds)


def seconds(text: str | float) -> float:
    """:func:`parse_duration` in seconds (a typer ``parser``: a bad value is reported as
    the option's bad parameter; a number, such as the option's default, is seconds)."""
    import typer

    if isinstance(text, int | float):
        return float(text)
    try:
        return parse_duration(text).total_seconds()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
