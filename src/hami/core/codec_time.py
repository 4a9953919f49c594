"""Node lock and handshake annotation values (HAMi v2.10).

Pure; part of :mod:`hami.core.codec`, which re-exports everything public here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Final, NamedTuple, cast

from hami.core.gowire import (
    CodecError,
    check_text,
    go_quote,
)

__all__ = [
    "Handshake",
    "NodeLock",
    "decode_handshake",
    "decode_node_lock",
    "encode_handshake",
    "encode_node_lock",
    "is_handshake_requesting",
]

# --- node lock (HAMi v2.10) -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeLock:
    """A parsed ``hami.io/mutex.lock`` value: when and by which pod (HAMi v2.10).

    ``time`` is timezone-aware. A legacy value (time only) has empty namespace and name.
    """

    time: datetime
    namespace: str
    name: str

    def is_owned_by(self, namespace: str, name: str) -> bool:
        """True when the lock names exactly this pod (field case B01: never a substring).

        A legacy lock (no owner recorded) is owned by nobody.
        """
        return bool(self.namespace or self.name) and (self.namespace, self.name) == (
            namespace,
            name,
        )


_RFC3339: Final = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{1,2}):([0-9]{2}):([0-9]{2})(?:[.,]([0-9]+))?"
    r"(?:(Z)|([+-])([0-9]{2}):([0-9]{2}))"
)
_DATETIME: Final = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2}) ([0-9]{1,2}):([0-9]{2}):([0-9]{2})(?:[.,]([0-9]+))?"
)


def _wall_clock(now: datetime) -> str:
    return f"{now.year:04d}-{now.month:02d}-{now.day:02d}T{now.hour:02d}:{now.minute:02d}:{now.second:02d}"


def _format_rfc3339(now: datetime) -> str:
    offset = now.utcoffset()
    if offset is None:
        raise CodecError(f"the lock time must be timezone-aware, got naive {now.isoformat()}")
    seconds = int(offset.total_seconds())
    if seconds == 0:
        return _wall_clock(now) + "Z"
    minutes = abs(seconds) // 60
    sign = "-" if seconds < 0 and minutes else "+"
    return _wall_clock(now) + f"{sign}{minutes // 60:02d}:{minutes % 60:02d}"


def _parse_wall_clock(groups: Sequence[str | None]) -> datetime:
    year, month, day, hour, minute, second = (int(cast(str, g)) for g in groups[:6])
    micro = int((groups[6] or "0")[:6].ljust(6, "0"))
    return datetime(year, month, day, hour, minute, second, micro)


def _parse_rfc3339(text: str) -> datetime:
    match = _RFC3339.fullmatch(text)
    try:
        if match is None:
            raise ValueError("not RFC3339")
        zone = UTC
        if match[8] is None:
            hours, minutes = int(match[10]), int(match[11])
            if hours > 23 or minutes > 59:
                raise ValueError("time zone offset out of range")
            delta = timedelta(hours=hours, minutes=minutes)
            zone = timezone(-delta if match[9] == "-" else delta)
        return _parse_wall_clock(match.groups()).replace(tzinfo=zone)
    except ValueError as exc:
        raise CodecError(f"lock time {go_quote(text)} is not RFC3339 ({exc})") from None


def encode_node_lock(now: datetime, namespace: str, name: str) -> str:
    """``<RFC3339>,<namespace>,<name>`` as HAMi's Bind writes it (HAMi v2.10).

    ``now`` must be timezone-aware; it is written with seconds precision in its own
    offset, ``Z`` for UTC (Go ``time.RFC3339``): ``2026-08-21T06:20:39Z``,
    ``2026-08-21T14:20:39+08:00``. Raises :class:`CodecError` for a naive time or a ``,``
    inside the namespace or name.
    """
    ns = check_text(namespace, ",", "lock namespace")
    pod = check_text(name, ",", "lock pod name")
    return f"{_format_rfc3339(now)},{ns},{pod}"


def decode_node_lock(value: str) -> NodeLock:
    """Parse a node lock value (HAMi v2.10).

    Without ``,`` the whole value is an RFC3339 time (legacy form; namespace and name
    ``""``); otherwise exactly three ``,`` parts are required. Raises :class:`CodecError`:
    ``malformed lock annotation: expected 3 parts, got N from <value>`` or a bad time.
    """
    parts = value.split(",")
    if len(parts) == 1:
        return NodeLock(_parse_rfc3339(value), "", "")
    if len(parts) != 3:
        raise CodecError(
            f"malformed lock annotation: expected 3 parts, got {len(parts)} from {value}"
        )
    return NodeLock(_parse_rfc3339(parts[0]), parts[1], parts[2])


# --- handshake (HAMi v2.10) ------------------------------------------------------------


class Handshake(NamedTuple):
    """A parsed ``hami.io/node-handshake`` value: ``state`` (text before the first ``_``,
    e.g. ``Requesting``) and the naive scheduler-local ``time`` after it (``None`` when
    absent or unparsable, which HAMi treats as "still healthy")."""

    state: str
    time: datetime | None


def encode_handshake(now: datetime) -> str:
    """``Requesting_<YYYY-MM-DD HH:MM:SS>`` from ``now``'s wall clock (Go ``time.DateTime``)."""
    return "Requesting_" + _wall_clock(now).replace("T", " ")


def decode_handshake(value: str) -> Handshake:
    """Split a handshake value into state and time; never raises (HAMi v2.10)."""
    state, _, stamp = value.partition("_")
    match = _DATETIME.fullmatch(stamp)
    if match is None:
        return Handshake(state, None)
    try:
        return Handshake(state, _parse_wall_clock(match.groups()))
    except ValueError:
        return Handshake(state, None)


def is_handshake_requesting(value: str) -> bool:
    """HAMi's test for a pending handshake: the value *contains* ``Requesting``."""
    return "Requesting" in value
