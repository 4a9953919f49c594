"""The monitor's feedback file: how libvgpu learns the monitor's decisions from a file no
container can write.

HAMi-core takes ``utilization_switch`` (limit launches to the SM share while the card is
contended) and the priority block (``recent_kernel < 0``) from the container's shared
region, a file in the container's read-write cache directory: any process of the
container can overwrite them. So the device plugin creates, at every Allocate (node-lock
and ``cdi`` modes) and DRA prepare, one more file in the plugin-private directory
``<hook>/vgpu/containers/<podUID>_<ctr>.plugin/`` (DRA: ``<hook>/vgpu/claims/<claimUID>.plugin/``)
and bind-mounts it read-only at ``<hook>/vgpu/feedback`` next to the library; the monitor
rewrites it in place every tick (``pwrite``: the bind mount pins the inode, so the file
is never replaced); libvgpu maps it read-only (``native/libvgpu/src/feedback.c``) and,
when it is there and valid, takes both decisions from it alone.

Layout (little-endian, :data:`SIZE` bytes)::

    0  u32 magic               MAGIC (b"VGFB")
    4  u32 version             VERSION (1)
    8  i32 utilization_switch  0 uncontended (launch freely), 1 limited
    12 i32 blocked             0 may launch, 1 blocked (priority)

The initial values (:data:`INITIAL`) are the safe ones: limited, not blocked.
"""

from __future__ import annotations

import os
import stat
import struct

from hami.deviceplugin.allocate import FEEDBACK_FILE

__all__ = ["FEEDBACK_FILE", "INITIAL", "MAGIC", "SIZE", "VALUES_OFFSET", "VERSION",
           "FeedbackFileError", "create", "decode", "encode", "write"]

MAGIC = b"VGFB"
VERSION = 1
#: Bytes of the file (``VG_FEEDBACK_SIZE``).
SIZE = 16
#: Offset of the two int32 decisions, written together in one ``pwrite``.
VALUES_OFFSET = 8
_HEADER = struct.Struct("<4sI")
_VALUES = struct.Struct("<ii")
#: ``(utilization_switch, blocked)`` before the monitor's first tick: limited, not blocked.
INITIAL: tuple[int, bool] = (1, False)


class FeedbackFileError(OSError):
    """The path is not a feedback file (missing, not a regular file, wrong size/magic)."""


def encode(utilization_switch: int, blocked: bool) -> bytes:
    """The whole file: header and the two values (``utilization_switch`` an int32,
    ``blocked`` stored as 1/0). Raises ``struct.error`` for a switch outside int32."""
    return _HEADER.pack(MAGIC, VERSION) + _VALUES.pack(utilization_switch, 1 if blocked else 0)


def decode(raw: bytes) -> tuple[int, bool]:
    """``(utilization_switch, blocked)`` of a file's bytes. Raises :class:`FeedbackFileError`
    unless ``raw`` is :data:`SIZE` bytes with the magic and version."""
    if len(raw) != SIZE or _HEADER.unpack_from(raw) != (MAGIC, VERSION):
        raise FeedbackFileError(f"not a version {VERSION} feedback file ({len(raw)} bytes)")
    switch, blocked = _VALUES.unpack_from(raw, VALUES_OFFSET)
    return switch, blocked != 0


def create(path: str) -> None:
    """Create ``path`` (mode 0644, parent made) holding :data:`INITIAL`, or reset an
    existing file to it in place (its inode kept: a running container's bind mount may
    pin it). Never follows a symlink at ``path``. Raises ``OSError``."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FeedbackFileError(f"{path}: not a regular file")
        data = encode(*INITIAL)
        if os.pwrite(fd, data, 0) != SIZE:
            raise FeedbackFileError(f"{path}: short write")
        os.ftruncate(fd, SIZE)  # only ever the same size: a mapping of it cannot fault
        os.fchmod(fd, 0o644)
    finally:
        os.close(fd)


def write(path: str, utilization_switch: int, blocked: bool) -> bool:
    """Store the monitor's decisions in the feedback file at ``path`` with one ``pwrite``
    at :data:`VALUES_OFFSET`. Returns False when there is no file (a pod allocated by a
    device plugin that made none: HAMi's, or one older than this file). Raises
    :class:`FeedbackFileError` when ``path`` is not a feedback file (a symlink, another
    kind of file, wrong size or header) and ``OSError`` on other failures."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise FeedbackFileError(f"{path}: {exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != SIZE:
            raise FeedbackFileError(f"{path}: not a {SIZE}-byte regular file")
        decode(os.pread(fd, SIZE, 0))
        if os.pwrite(fd, _VALUES.pack(utilization_switch, 1 if blocked else 0),
                     VALUES_OFFSET) != _VALUES.size:
            raise FeedbackFileError(f"{path}: short write")
    finally:
        os.close(fd)
    return True
