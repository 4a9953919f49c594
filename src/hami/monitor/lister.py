"""Finding, reading and forgetting container cache files (HAMi-core 1.2).

Layout on the host: ``$HOOK_PATH/containers/<podUID>_<container>/<uuid4>.cache`` (the
monitor's ``HOOK_PATH`` is the plugin's ``$HOOK_PATH/vgpu``). The monitor writes only
``recent_kernel`` and ``utilization_switch`` (HAMi-core 1.2).

Cache files are written by the containers, so every byte of them is hostile input.
HAMi maps each file read-write for the container's lifetime; a container that
truncates its file makes the next read fault (SIGBUS kills the monitor for every
container of the node). Here no container file is ever mapped:

* a file is opened without following symlinks (``O_PATH | O_NOFOLLOW`` relative to the
  directory's descriptor), must be a regular file (never a FIFO or a device node the
  container made), and only then reopened read-write through ``/proc/self/fd``;
* every read is a ``pread`` of the fields the monitor needs after an ``fstat``; a short
  read (the file shrank meanwhile) or any malformed content drops that container's
  series for that scrape or tick, with one log line per new error;
* the two feedback fields are written with ``pwrite`` at their offsets;
* a file replaced by another (new inode) is reopened at the next update;
* a directory is read up to :data:`MAX_CACHE_DIR_ENTRIES` entries (one holding more is
  skipped, not listed and sorted whole at every tick) and an error message quotes at most
  three of its names, each cut short (a container can create 200,000 names there).

The files of finished pods (Succeeded, Failed) are closed while their directories stay
until the pod is deleted (see :mod:`hami.monitor.pods`).
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path

from hami.monitor.feedback import BlockBudget
from hami.monitor.region import V1_SIZE, Region, RegionError, read_region

log = logging.getLogger(__name__)

#: Offsets of the int32 fields the monitor writes, per layout version (HAMi-core 1.2).
WRITABLE_OFFSETS = {
    1: {"utilization_switch": 2_008_900, "recent_kernel": 2_008_904},
    0: {"utilization_switch": 1_197_884, "recent_kernel": 1_197_888},
}

#: Errors a hostile or half-written file can cause while it is read or parsed.
READ_ERRORS = (RegionError, OSError, struct.error, ValueError, IndexError, OverflowError)


#: Suffix of the plugin-private directory next to a container's cache directory (the
#: device plugin's; no container sees it: limits.env, feedback, vgpulock).
PLUGIN_SUFFIX = ".plugin"


class CacheError(RuntimeError):
    """A container directory or cache file cannot be used (logged, retried next tick)."""


@dataclass
class CacheFile:
    """One open cache file. ``version`` is the layout of the last read (0 legacy, 1
    current); ``ino``/``dev`` identify the file that was opened."""

    key: str
    pod_uid: str
    container: str
    path: Path
    version: int
    fd: int
    ino: int = 0
    dev: int = 0
    closed: bool = False

    def same_file(self) -> bool:
        """True while ``path`` still names the opened file (not removed or replaced)."""
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return False
        return (st.st_ino, st.st_dev) == (self.ino, self.dev)

    def read(self) -> Region:
        """Parse the region now with ``pread``. Raises :class:`RegionError` (corrupt,
        truncated, closed, not a regular file); never faults."""
        if self.closed:
            raise RegionError(f"{self.path}: closed")
        fd = self.fd
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise RegionError("not a regular file")
            region = read_region(lambda off, n: os.pread(fd, n, off), st.st_size)
        except READ_ERRORS as exc:
            raise RegionError(f"{self.path}: {exc}") from None
        self.version = 1 if region.version != (0, 0) else 0
        return region

    def write_int32(self, name: str, value: int) -> None:
        """Store ``recent_kernel`` or ``utilization_switch`` (little-endian int32) with
        ``pwrite``; raises :class:`RegionError` when the file is now too short for it."""
        if self.closed:
            raise RegionError(f"{self.path}: closed")
        off = WRITABLE_OFFSETS[self.version][name]
        if os.fstat(self.fd).st_size < off + 4:
            raise RegionError(f"{self.path}: shrank below the {name} field")
        if os.pwrite(self.fd, struct.pack("<i", value), off) != 4:
            raise RegionError(f"{self.path}: short write of {name}")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        os.close(self.fd)


def open_regular(directory_fd: int, name: str) -> int:
    """Open ``name`` in the directory ``directory_fd`` read-write, only if it is a regular
    file and not a symlink; returns the descriptor. Raises :class:`RegionError`.

    The entry is first opened with ``O_PATH | O_NOFOLLOW`` (no device, FIFO or symlink
    target is ever opened), checked with ``fstat``, then that same inode is reopened
    through ``/proc/self/fd`` (a rename in between cannot substitute another file).
    """
    try:
        pfd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory_fd)
    except OSError as exc:
        raise RegionError(f"{name}: {exc}") from None
    try:
        st = os.fstat(pfd)
        if not stat.S_ISREG(st.st_mode):
            raise RegionError(f"{name}: not a regular file")
        try:
            fd = os.open(f"/proc/self/fd/{pfd}", os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:  # no /proc: open by name, still refusing symlinks
            fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                         | os.O_CLOEXEC, dir_fd=directory_fd)
        except OSError as exc:
            raise RegionError(f"{name}: {exc}") from None
    except OSError as exc:
        raise RegionError(f"{name}: {exc}") from None
    finally:
        os.close(pfd)
    st2 = os.fstat(fd)
    if not stat.S_ISREG(st2.st_mode) or (st2.st_ino, st2.st_dev) != (st.st_ino, st.st_dev):
        os.close(fd)
        raise RegionError(f"{name}: replaced while opening")
    return fd


def split_dir_name(name: str) -> tuple[str, str] | None:
    """``<podUID>_<container>`` split at the first ``_``; None unless both parts are set."""
    uid, sep, ctr = name.partition("_")
    if not sep or not uid or not ctr:
        return None
    return uid, ctr


#: Most entries of one container's cache directory the monitor reads: libvgpu keeps one
#: ``<uuid>.cache`` file there (HAMi's layout may add ``libvgpu.so``). The directory is the
#: container's: a directory holding more is skipped (logged once) instead of being listed
#: and sorted whole at every tick.
MAX_CACHE_DIR_ENTRIES = 64
#: Names quoted in one error message, each cut to :data:`NAME_CHARS_IN_LOG` characters.
NAMES_IN_LOG = 3
NAME_CHARS_IN_LOG = 64


def names_for_log(names: list[str]) -> str:
    """At most :data:`NAMES_IN_LOG` of ``names``, each quoted and cut to
    :data:`NAME_CHARS_IN_LOG` characters, then the count of the rest (file names are the
    container's: a log line stays under a KiB whatever they are)."""
    shown = ", ".join(repr(n[:NAME_CHARS_IN_LOG]) + ("..." if len(n) > NAME_CHARS_IN_LOG else "")
                      for n in names[:NAMES_IN_LOG])
    rest = len(names) - NAMES_IN_LOG
    return shown + (f" and {rest} more" if rest > 0 else "")


def list_cache_dir(directory_fd: int, label: str) -> list[str]:
    """The names in the open directory ``directory_fd``, reading at most
    :data:`MAX_CACHE_DIR_ENTRIES` + 1 entries whatever it holds.

    Raises :class:`CacheError` when it holds more (the message gives the limit, not the
    names) or cannot be read."""
    names: list[str] = []
    try:
        with os.scandir(directory_fd) as entries:
            for entry in entries:
                if len(names) == MAX_CACHE_DIR_ENTRIES:
                    raise CacheError(f"{label}: more than {MAX_CACHE_DIR_ENTRIES} entries (the "
                                     "directory should hold the cache file only)")
                names.append(entry.name)
    except OSError as exc:
        raise CacheError(f"{label}: {exc}") from None
    return names


def pick_cache_file(names: Iterable[str]) -> str | None:
    """HAMi's ``loadCache`` choice among a directory's entries (sorted).

    More than 2 entries containing ``libvgpu.so`` or ending in ``.cache`` -> CacheError
    (naming at most :data:`NAMES_IN_LOG` of them); returns the first ``*.cache`` entry
    without ``libvgpu.so`` in its name, or None.
    """
    names = sorted(names)
    relevant = [n for n in names if "libvgpu.so" in n or n.endswith(".cache")]
    if len(relevant) > 2:
        raise CacheError(f"too many cache/libvgpu entries: {names_for_log(relevant)}")
    for n in names:
        if "libvgpu.so" not in n and n.endswith(".cache"):
            return n
    return None


def open_cache(key: str, directory: Path) -> CacheFile | None:
    """Open the cache file of one container directory; None when there is none yet.

    Raises :class:`CacheError` / :class:`RegionError` (too small, bad magic, unknown
    version, not a regular file) — the caller logs and retries next tick.
    """
    parts = split_dir_name(key)
    if parts is None:
        return None
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise CacheError(f"{directory}: {exc}") from None
    return open_cache_in(dfd, key, parts[0], parts[1], directory, label=str(directory))


def open_cache_in(dfd: int, key: str, pod_uid: str, container: str, directory: Path, *,
                  label: str) -> CacheFile | None:
    """The cache file in the already opened directory ``dfd`` (closed here), picked by
    :func:`pick_cache_file` among at most :data:`MAX_CACHE_DIR_ENTRIES` entries
    (:func:`list_cache_dir`), opened without following links and read once; None when
    there is none yet. ``label`` names the directory in errors. Shared by containers'
    and DRA claims' directories. Raises :class:`CacheError` / :class:`RegionError`."""
    try:
        name = pick_cache_file(list_cache_dir(dfd, label))
        if name is None:
            return None
        fd = open_regular(dfd, name)
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    cf = CacheFile(key, pod_uid, container, directory / name, 1 if st.st_size >= V1_SIZE else 0,
                   fd, st.st_ino, st.st_dev)
    try:
        cf.read()  # a file that is not a region yet is retried next tick
    except RegionError:
        cf.close()
        raise
    return cf


@dataclass
class ContainerLister:
    """The loaded cache files of this node's containers (``ContainerLister.Update``).

    ``root`` is ``$HOOK_PATH/containers``; ``grace_s`` the resync interval (default 5 min)
    a directory of an unknown pod is kept after its last modification. ``blocks`` is the
    feedback loop's memory of which containers it blocked in its last ticks
    (:class:`~hami.monitor.feedback.BlockBudget`, used by
    :func:`hami.monitor.command.feedback_tick`). ``plugin_dirs``: container key ->
    its plugin-private ``<key>.plugin`` directory (holding the feedback file), for the
    live, unfinished pods of the last :meth:`update`; ``feedback_errors``: the last
    feedback-file error per key (logged once).
    """

    root: Path
    grace_s: float = 300.0
    clock: Callable[[], float] = time.time
    containers: dict[str, CacheFile] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)
    errors: dict[str, str] = field(default_factory=dict)
    read_errors: dict[str, str] = field(default_factory=dict)
    read_errors_total: int = 0
    blocks: BlockBudget = field(default_factory=BlockBudget)
    plugin_dirs: dict[str, Path] = field(default_factory=dict)
    feedback_errors: dict[str, str] = field(default_factory=dict)

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
        plugin_dirs: dict[str, Path] = {}
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
                if "." in parts[1]:  # not a container (names are DNS labels): plugin files
                    if parts[1].endswith(PLUGIN_SUFFIX):
                        plugin_dirs[e.name[:-len(PLUGIN_SUFFIX)]] = Path(e.path)
                    continue
                loaded = self.containers.get(e.name)
                if loaded is not None:
                    if loaded.same_file():
                        continue
                    log.info("reopening %s: its cache file was removed or replaced", e.name)
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
            self.plugin_dirs = plugin_dirs
            self.feedback_errors = {k: v for k, v in self.feedback_errors.items()
                                    if k in plugin_dirs or k.startswith("claim:")}

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
        self.read_errors.pop(key, None)
        cf = self.containers.pop(key, None)
        if cf is not None:
            cf.close()

    def read_all(self) -> dict[str, tuple[CacheFile, Region]]:
        """Parse every loaded file; a corrupt, truncated or foreign one is left out (its
        container has no series this time), counted in ``read_errors_total`` and logged
        once per distinct error."""
        out = {}
        with self.lock:
            for key, cf in list(self.containers.items()):
                try:
                    out[key] = (cf, cf.read())
                except RegionError as exc:
                    self.read_errors_total += 1
                    if self.read_errors.get(key) != str(exc):
                        log.warning("skipping %s: %s", key, exc)
                    self.read_errors[key] = str(exc)
                    continue
                self.read_errors.pop(key, None)
        return out

    def close(self) -> None:
        with self.lock:
            for key in list(self.containers):
                self._forget(key)
