"""The minimum read rate of an HTTP peer: whether it takes the bytes waiting for it fast
enough (pure; the servers feed it the kernel's counts, :mod:`hami.netlimits`).

The rule, over a sliding window of ``window_s`` seconds (the servers' write timeout): a
peer is too slow when bytes we handed for it at least ``window_s`` ago are still not
taken (so it had bytes to take for the whole time) and it took fewer than
``max(1, min_bytes_per_s * elapsed_s)`` bytes since then. A peer that takes nothing is
cut after ``window_s`` (the write deadline); one that trickles, however steadily, below
the floor is cut too (a slow-read attack); so a whole answer of ``n`` bytes must be
taken within about ``window_s + n / min_bytes_per_s``. A peer with nothing waiting for
it (idle keep-alive, or all taken) is never too slow. ``min_bytes_per_s`` 0 keeps only
the "took nothing" rule.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SlowRead:
    """A verdict of :meth:`ReadRateRule.reading`: the peer took ``taken_bytes`` in the
    last ``elapsed_s`` seconds while bytes waited for it the whole time."""

    elapsed_s: float
    taken_bytes: int

    @property
    def rate_bytes_per_s(self) -> float:
        return self.taken_bytes / self.elapsed_s if self.elapsed_s > 0 else 0.0


class ReadRateRule:
    """The rule of the module doc for one connection.

    ``window_s`` (> 0): the sliding window, seconds. ``min_bytes_per_s`` (>= 0): the
    floor. Feed :meth:`reading` from time to time (every ``window_s / 2`` or more often)
    with cumulative counts since the connection opened.

    Raises:
        ValueError: ``window_s`` not positive or ``min_bytes_per_s`` negative.
    """

    __slots__ = ("min_bytes_per_s", "window_s", "_readings")

    def __init__(self, window_s: float, min_bytes_per_s: float) -> None:
        if not window_s > 0 or not min_bytes_per_s >= 0:
            raise ValueError(f"window_s must be positive and min_bytes_per_s not negative, "
                             f"got {window_s!r} and {min_bytes_per_s!r}")
        self.window_s = float(window_s)
        self.min_bytes_per_s = float(min_bytes_per_s)
        self._readings: deque[tuple[float, int, int]] = deque()

    def reading(self, now_s: float, acked_bytes: int, written_bytes: int) -> SlowRead | None:
        """Record one reading and judge it: ``now_s`` a monotonic clock, ``acked_bytes``
        the bytes the peer has taken so far, ``written_bytes`` the bytes handed for it
        so far (taken plus still waiting). A :class:`SlowRead` when the peer is too slow
        (the caller closes the connection), else None."""
        readings = self._readings
        if acked_bytes >= written_bytes:  # nothing waits: no window can span this
            readings.clear()
            readings.append((now_s, acked_bytes, written_bytes))
            return None
        readings.append((now_s, acked_bytes, written_bytes))
        # the newest reading at least a window old; older ones are no longer needed
        while len(readings) > 1 and now_s - readings[1][0] >= self.window_s:
            readings.popleft()
        then_s, acked_then, written_then = readings[0]
        elapsed_s = now_s - then_s
        if elapsed_s < self.window_s or acked_bytes >= written_then:
            return None
        taken = acked_bytes - acked_then
        if taken < max(1.0, self.min_bytes_per_s * elapsed_s):
            return SlowRead(elapsed_s, taken)
        return None


__all__ = ["ReadRateRule", "SlowRead"]
