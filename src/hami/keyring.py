"""The allocation-signing keys shared by the scheduler and the device plugins.

The chart keeps them in one Secret (created by the chart, rotated by ``hami certgen
--rotate-allocation-key``) mounted read-only into the scheduler and every device-plugin
pod; the directory holds ``current`` and, around a rotation, ``next`` and ``previous``:
text files of at least 32 characters (64 hex digits as written). The scheduler signs
with ``current``; a device plugin accepts all three, so a rotation is two steps that
never refuse a valid allocation: the first adds ``next`` (everyone learns it within
kubelet's volume sync), the second makes it ``current`` and keeps the old one as
``previous``. Files are re-read when they change, so a rotation needs no restart.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

CURRENT, NEXT, PREVIOUS = "current", "next", "previous"
MIN_KEY_CHARS = 32


class KeyRingError(RuntimeError):
    """The key directory or its ``current`` key is missing or too short."""


class KeyRing:
    """Keys of one directory, re-read at most every ``recheck_s`` seconds when a file's
    modification time or size changed.

    Raises:
        KeyRingError: at construction, when ``current`` cannot be read or is shorter
            than :data:`MIN_KEY_CHARS`.
    """

    def __init__(self, directory: str | os.PathLike[str], *, recheck_s: float = 2.0) -> None:
        self.directory = Path(directory)
        self.recheck_s = recheck_s
        self._checked = 0.0
        self._stamp: tuple[tuple[float, int], ...] = ()
        self._keys: tuple[bytes, ...] = ()
        self._load()

    def _stat(self) -> tuple[tuple[float, int], ...]:
        out = []
        for name in (CURRENT, NEXT, PREVIOUS):
            try:
                st = (self.directory / name).stat()
                out.append((st.st_mtime, st.st_size))
            except OSError:
                out.append((0.0, -1))
        return tuple(out)

    def _load(self) -> None:
        stamp = self._stat()
        try:
            current = (self.directory / CURRENT).read_bytes().strip()
        except OSError as exc:
            raise KeyRingError(f"cannot read the allocation key {self.directory / CURRENT}: "
                               f"{exc.strerror}") from None
        if len(current) < MIN_KEY_CHARS:
            raise KeyRingError(f"the allocation key {self.directory / CURRENT} has "
                               f"{len(current)} characters; at least {MIN_KEY_CHARS} needed")
        keys = [current]
        for name in (NEXT, PREVIOUS):
            try:
                other = (self.directory / name).read_bytes().strip()
            except OSError:
                continue
            if len(other) >= MIN_KEY_CHARS and other not in keys:
                keys.append(other)
        self._keys, self._stamp = tuple(keys), stamp

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked < self.recheck_s:
            return
        self._checked = now
        if self._stat() != self._stamp:
            with contextlib.suppress(KeyRingError):  # half-written rotation: keep ours
                self._load()

    def signing_key(self) -> bytes:
        """The key new signatures use (``current``)."""
        self._refresh()
        return self._keys[0]

    def verifying_keys(self) -> tuple[bytes, ...]:
        """The keys a signature may be made with: ``current``, ``next``, ``previous``."""
        self._refresh()
        return self._keys
