"""Finding, mapping and forgetting container cache files (hami-core-spec §C.2, §D).

Layout on the host: ``$HOOK_PATH/containers/<podUID>_<container>/<uuid4>.cache`` (the
monitor's ``HOOK_PATH`` is the plugin's ``$HOOK_PATH/vgpu``). Each cache file is
memory-mapped read-write, shared, for the container's lifetime; the monitor writes only
``recent_kernel`` and ``utilization_switch`` (spec §D).

Robustness beyond HAMi: before every read the file's size is compared with the mapping's;
a file that shrank (reading it would raise SIGBUS) or grew is unmapped and reloaded at the
next update, so one bad file never takes the monitor or other containers down. The
files of finished pods (Succeeded, Failed) are unmapped while their directories stay
until the pod is deleted (see :mod:`hami.monitor.pods`).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path

from hami.monitor.region import V1_SIZE, Region, RegionError, detect_layout, parse_region

log = logging.getLogger(__name__)

#: Offsets of the int32 fields the monitor writes, per layout version (spec §A.6.1).
WRITABLE_OFFSETS = {
    1: {"utilization_switch": 2_008_900, "recent_kernel": 2_008_904},
    0: {"utilization_switch": 1_197_884, "recent_kernel": 1_197_888},
}


class CacheError(RuntimeError):
    """A container directory or cache file cannot be used (logged, retried next tick)."""


@dataclass
class CacheFile:
    """One mapped cache file. ``version`` is the layout (0 legacy, 1 current)."""

    key: str
    pod_uid: str
    container: str
    path: Path
    size: int
    version: int
    fd: int
    mm: mmap.mmap
    closed: bool = False

    def check_size(self) -> None:
        """Raise :class:`RegionError` when the file's size differs from the mapping's."""
        size = os.fstat(self.fd).st_size
        if size != self.size:
            raise RegionError(f"{self.path}: size changed {self.size} -> {size} bytes")

    def read(self) -> Region:
        """Parse the region now. Raises :class:`RegionError` (corrupt/changed/closed)."""
        if self.closed:
            raise RegionError(f"{self.path}: unmapped")
        self.check_size()
        try:
            return _parse(self.mm, self.path)
        finally:
            self.release_pages()

    def release_pages(self) -> None:
        """Drop this mapping's page-table entries (``MADV_DONTNEED``; for a shared file
        mapping the data stays in the page cache). Large page-cache folios would otherwise
        keep ~0.5 MiB per container resident after a read of a few fields."""
        with contextlib.suppress(OSError, ValueError):
            self.mm.madvise(mmap.MADV_DONTNEED)

    def write_int32(self, name: str, value: int) -> None:
        """Store ``recent_kernel`` or ``utilization_switch`` (little-endian int32)."""
        self.check_size()
        struct.pack_into("<i", self.mm, WRITABLE_OFFSETS[self.version][name], value)
        self.release_pages()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.mm.close()
        except BufferError:  # a view is still alive somewhere: the GC unmaps it later
            log.warning("%s: mapping still referenced, left to the garbage collector", self.path)
        finally:
            os.close(self.fd)


def _parse(mm: mmap.mmap, path: Path) -> Region:
    """Parse ``mm``; errors are re-raised *outside* the except block so that no traceback
    frame keeps a memoryview of the mapping alive (which would make ``close`` fail)."""
    err = None
    try:
        return parse_region(mm)  # type: ignore[arg-type]  # mmap has the buffer protocol
    except (RegionError, struct.error, ValueError, IndexError, OverflowError) as exc:
        err = str(exc)
    raise RegionError(f"{path}: {err}")


def split_dir_name(name: str) -> tuple[str, str] | None:
    """``<podUID>_<container>`` split at the first ``_``; None unless both parts are set."""
    uid, sep, ctr = name.partition("_")
    if not sep or not uid or not ctr:
        return None
    return uid, ctr


def pick_cache_file(names: Iterable[str]) -> str | None:
    """HAMi's ``loadCache`` choice among a directory's entries (sorted).

    More than 2 entries containing ``libvgpu.so`` or ending in ``.cache`` -> CacheError;
    returns the first ``*.cache`` entry without ``libvgpu.so`` in its name, or None.
    """
    names = sorted(names)
    relevant = [n for n in names if "libvgpu.so" in n or n.endswith(".cache")]
    if len(relevant) > 2:
        raise CacheError(f"too many cache/libvgpu entries: {relevant}")
    for n in names:
        if "libvgpu.so" not in n and n.endswith(".cache"):
            return n
    return None


def open_cache(key: str, directory: Path) -> CacheFile | None:
    """Map the cache file of one container directory; None when there is none yet.

    Raises :class:`CacheError` / :class:`RegionError` (too small, bad magic, unknown
    version) — the caller logs and retries next tick.
    """
    parts = split_dir_name(key)
    if parts is None:
        return None
    try:
        name = pick_cache_file(os.listdir(directory))
    except OSError as exc:
        raise CacheError(f"{directory}: {exc}") from None
    if name is None:
        return None
    path = directory / name
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as exc:
        raise CacheError(f"{path}: {exc}") from None
    try:
        size = os.fstat(fd).st_size
        if size < 12:
            raise RegionError(f"{path}: {size} bytes, too small")
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        mm.madvise(mmap.MADV_RANDOM)
    except (OSError, ValueError, RegionError) as exc:
        os.close(fd)
        raise RegionError(str(exc)) from None
    err = None
    try:
        detect_layout(mm)  # type: ignore[arg-type]
    except RegionError as exc:
        err = str(exc)
    mm.madvise(mmap.MADV_DONTNEED)
    if err is not None:  # raised outside the handler: no frame keeps a view of ``mm``
        mm.close()
        os.close(fd)
        raise RegionError(f"{path}: {err}")
    version = 1 if size >= V1_SIZE else 0
    return CacheFile(key, parts[0], parts[1], path, size, version, fd, mm)


@dataclass
class ContainerLister:
    """The loaded cache files of this node's containers (``ContainerLister.Update``).

    ``root`` is ``$HOOK_PATH/containers``; ``grace_s`` the resync interval (default 5 min)
    a directory of an unknown pod is kept after its last modification.
    """

    root: Path
    grace_s: float = 300.0
    clock: Callable[[], float] = time.time
    containers: dict[str, CacheFile] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)
    errors: dict[str, str] = field(default_factory=dict)

    def update(self, live_pod_uids: AbstractSet[str] | None,
               finished_pod_uids: AbstractSet[str] = frozenset()) -> None:
        """One scan. ``live_pod_uids`` None means "pod list unknown": nothing is removed.

        A directory of a pod in ``finished_pod_uids`` (Succeeded or Failed, still present)
        is neither loaded nor kept mapped, so it has no series and the feedback loop
        leaves it alone; the directory itself stays until the pod is gone.
        """
        try:
            entries = list(os.scandir(self.root))
        except OSError as exc:
            log.warning("cannot list %s: %s", self.root, exc)
            return
        seen = set()
        with self.lock:
            for e in entries:
                try:
                    if not e.is_dir(follow_symlinks=False):
                        continue
                except OSError:
                    continue
                parts = split_dir_name(e.name)
                if parts is None:
                    continue
                seen.add(e.name)
                if live_pod_uids is not None and parts[0] not in live_pod_uids:
                    self._maybe_remove(e.name, Path(e.path))
                    continue
                if parts[0] in finished_pod_uids:
                    self._forget(e.name)
                    self.errors.pop(e.name, None)
                    continue
                loaded = self.containers.get(e.name)
                if loaded is not None:
                    try:
                        loaded.check_size()
                        continue
                    except (RegionError, OSError) as exc:
                        log.warning("reloading %s: %s", e.name, exc)
                        self._forget(e.name)
                try:
                    cf = open_cache(e.name, Path(e.path))
                except (CacheError, RegionError) as exc:
                    if self.errors.get(e.name) != str(exc):
                        log.warning("skipping %s: %s", e.name, exc)
                    self.errors[e.name] = str(exc)
                    continue
                self.errors.pop(e.name, None)
                if cf is not None:
                    self.containers[e.name] = cf
            for key in list(self.containers):
                if key not in seen:
                    self._forget(key)

    def _maybe_remove(self, key: str, path: Path) -> None:
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return
        if mtime + self.grace_s > self.clock():
            return
        self._forget(key)
        shutil.rmtree(path, ignore_errors=True)
        log.info("removed %s (pod gone)", path)

    def _forget(self, key: str) -> None:
        cf = self.containers.pop(key, None)
        if cf is not None:
            cf.close()

    def read_all(self) -> dict[str, tuple[CacheFile, Region]]:
        """Parse every loaded file; corrupt or changed ones are logged and skipped."""
        out = {}
        with self.lock:
            for key, cf in list(self.containers.items()):
                try:
                    out[key] = (cf, cf.read())
                except (RegionError, OSError) as exc:
                    log.warning("skipping %s: %s", key, exc)
        return out

    def close(self) -> None:
        with self.lock:
            for key in list(self.containers):
                self._forget(key)
