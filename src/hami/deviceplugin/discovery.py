"""GPU discovery behind one small interface, two backends (HAMi-core 1.2).

* :class:`NvmlBackend` — ``nvidia-ml-py``: UUID, index, name, total memory, NUMA node from
  ``/sys/bus/pci/devices/<busid>/numa_node``, MIG capability; health from NVML events.
* :class:`FakeBackend` — a YAML inventory for clusters and tests without GPUs; the file is
  re-read when it changes, and ``health: false`` or a listed ``xid`` event turns a GPU
  Unhealthy through the same rules as NVML events (:mod:`hami.deviceplugin.health`).

Fake inventory format::

    gpus:
      - model: NVIDIA A100-SXM4-80GB   # NVML name
        memory_mib: 81920              # omit to simulate "memory query unsupported"
        count: 2                       # this many identical GPUs (default 1)
        numa: 0
        health: true                   # default true
        uuids: [GPU-a, GPU-b]          # optional; default GPU-fake-<index>
        mig_capable: false             # default: true when mig_profiles are listed
        mig_profiles: [...]            # MIG GI profiles (format: hami.deviceplugin.migfake)
    mig_instances: [...]               # MIG instances existing at start (migfake)
    xid_events:                        # optional, applied once each: {uuid|null, xid}
      - {uuid: GPU-a, xid: 79}
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from hami.deviceplugin.health import EVENT_MASK, EVENT_XID_CRITICAL
from hami.deviceplugin.migdriver import MigDriver, MigDriverError
from hami.deviceplugin.migfake import FakeMig
from hami.deviceplugin.mignvml import NvmlMig

log = logging.getLogger(__name__)


class DiscoveryError(RuntimeError):
    """The backend cannot list GPUs (no driver, unreadable inventory)."""


@dataclass(frozen=True, slots=True)
class PhysicalGpu:
    """One physical GPU. ``memory_bytes`` is None when the backend cannot report it."""

    uuid: str
    index: int
    name: str
    memory_bytes: int | None
    numa: int = 0
    mig_capable: bool = False
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """An NVML-style event: ``uuid`` None means "the wait failed" (marks every GPU)."""

    uuid: str | None
    event_type: int
    xid: int


class GpuBackend(Protocol):
    """What the plugin needs from a discovery backend."""

    def devices(self) -> list[PhysicalGpu]:
        """The GPUs now, in index order. Raises :class:`DiscoveryError`."""
        ...

    def wait_event(self, timeout_s: float) -> HealthEvent | None:
        """Block up to ``timeout_s`` for the next health event; None on timeout."""
        ...

    def close(self) -> None:
        """Release driver resources."""
        ...

    def mig_driver(self) -> MigDriver:
        """MIG instance operations (profiles, create, list, destroy) for these GPUs."""
        ...


# --- fake --------------------------------------------------------------------------------


def parse_inventory(text: str) -> tuple[list[PhysicalGpu], list[HealthEvent]]:
    """Parse a fake inventory (format in the module docstring).

    Returns the GPUs (indices assigned in file order) and the XID events listed.
    Raises :class:`DiscoveryError` on a malformed file.
    """
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise DiscoveryError(f"fake inventory is not YAML: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("gpus", []), list):
        raise DiscoveryError("fake inventory must be a mapping with a 'gpus' list")
    gpus: list[PhysicalGpu] = []
    for n, entry in enumerate(raw.get("gpus", [])):
        if not isinstance(entry, dict):
            raise DiscoveryError(f"gpus[{n}] must be a mapping")
        count = entry.get("count", 1)
        mem = entry.get("memory_mib")
        uuids = entry.get("uuids") or ([entry["uuid"]] if "uuid" in entry else None)
        if not isinstance(count, int) or count < 0:
            raise DiscoveryError(f"gpus[{n}].count must be a non-negative integer")
        if mem is not None and (not isinstance(mem, int) or mem < 0):
            raise DiscoveryError(f"gpus[{n}].memory_mib must be a non-negative integer")
        if uuids is not None and (not isinstance(uuids, list) or len(uuids) != count):
            raise DiscoveryError(f"gpus[{n}].uuids must list exactly {count} UUIDs")
        for k in range(count):
            index = len(gpus)
            gpus.append(PhysicalGpu(
                uuid=str(uuids[k]) if uuids else f"GPU-fake-{index}",
                index=index,
                name=str(entry.get("model", "NVIDIA Fake GPU")),
                memory_bytes=None if mem is None else mem * 2**20,
                numa=int(entry.get("numa", 0)),
                mig_capable=bool(entry.get("mig_capable", bool(entry.get("mig_profiles")))),
                healthy=bool(entry.get("health", True)),
            ))
    events = []
    for ev in raw.get("xid_events") or []:
        if not isinstance(ev, dict) or not isinstance(ev.get("xid"), int):
            raise DiscoveryError("xid_events entries need an integer 'xid'")
        events.append(HealthEvent(ev.get("uuid"), EVENT_XID_CRITICAL, ev["xid"]))
    return gpus, events


class FakeBackend:
    """GPUs from a YAML file; changes to the file are picked up by :meth:`wait_event`.

    A GPU whose ``health`` turns false yields a synthetic fatal event (XID 79, "fallen off
    the bus"); each new ``xid_events`` entry yields its event once.
    """

    def __init__(self, path: Path, poll_s: float = 0.2) -> None:
        self.path = path
        self.poll_s = poll_s
        self._stamp: tuple[int, int] | None = None
        self._gpus: list[PhysicalGpu] = []
        self._seen_events = 0
        self._pending: list[HealthEvent] = []
        self._reported_down: set[str] = set()
        self._closed = threading.Event()
        self._reload(initial=True)
        self._mig: FakeMig | None = None

    def mig_driver(self) -> MigDriver:
        """:class:`~hami.deviceplugin.migfake.FakeMig` over this inventory (created once;
        its instance table is ``<inventory>.mig-state.json``). Raises
        :class:`DiscoveryError` on a malformed MIG section."""
        if self._mig is None:
            try:
                self._mig = FakeMig(self.path, [g.uuid for g in self._gpus])
            except (MigDriverError, OSError) as exc:
                raise DiscoveryError(f"fake inventory MIG section: {exc}") from None
        return self._mig

    def _reload(self, initial: bool = False) -> None:
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return
            gpus, events = parse_inventory(self.path.read_text())
        except OSError as exc:
            raise DiscoveryError(f"cannot read fake inventory {self.path}: {exc}") from None
        self._stamp = stamp
        self._gpus = gpus
        if initial:
            self._reported_down = {g.uuid for g in gpus if not g.healthy}
            self._pending.extend(events)
            self._seen_events = len(events)
            return
        for g in gpus:
            if not g.healthy and g.uuid not in self._reported_down:
                self._reported_down.add(g.uuid)
                self._pending.append(HealthEvent(g.uuid, EVENT_XID_CRITICAL, 79))
        self._pending.extend(events[self._seen_events:])
        self._seen_events = max(self._seen_events, len(events))

    def devices(self) -> list[PhysicalGpu]:
        """The GPUs as last read (initial health from the file)."""
        return list(self._gpus)

    def wait_event(self, timeout_s: float) -> HealthEvent | None:
        """Poll the file every ``poll_s`` until an event is pending or ``timeout_s`` passes."""
        remaining = timeout_s
        while True:
            try:
                self._reload()
            except DiscoveryError as exc:
                log.warning("fake inventory: %s", exc)
            if self._pending:
                return self._pending.pop(0)
            if remaining <= 0 or self._closed.wait(min(self.poll_s, remaining)):
                return None
            remaining -= self.poll_s

    def close(self) -> None:
        self._closed.set()


# --- NVML --------------------------------------------------------------------------------


def numa_node_of(bus_id: str, sysfs: Path = Path("/sys/bus/pci/devices")) -> int:
    """NUMA node of a PCI device from sysfs; missing/unreadable/negative -> 0 (HAMi-core 1.2).

    ``bus_id`` is NVML's ``00000000:3B:00.0``; sysfs names use a 4-digit domain,
    lower case (``0000:3b:00.0``).
    """
    bid = bus_id.lower()
    if len(bid.split(":")[0]) == 8:
        bid = bid[4:]
    try:
        value = int((sysfs / bid / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return 0
    return max(value, 0)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """GPUs and XID events through ``pynvml`` (package ``nvidia-ml-py``)."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise DiscoveryError("nvidia-ml-py is not installed") from exc
        self.nv = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise DiscoveryError(f"NVML init failed: {exc}") from None
        self._event_set: Any = None
        self._handles: dict[str, Any] = {}

    def devices(self) -> list[PhysicalGpu]:
        nv = self.nv
        out = []
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                uuid = _text(nv.nvmlDeviceGetUUID(h))
                self._handles[uuid] = h
                try:
                    mem: int | None = int(nv.nvmlDeviceGetMemoryInfo(h).total)
                except nv.NVMLError:
                    mem = None
                try:
                    mig = nv.nvmlDeviceGetMigMode(h) is not None
                except nv.NVMLError:
                    mig = False
                try:
                    numa = numa_node_of(_text(nv.nvmlDeviceGetPciInfo(h).busId))
                except nv.NVMLError:
                    numa = 0
                out.append(PhysicalGpu(uuid, i, _text(nv.nvmlDeviceGetName(h)), mem, numa, mig))
        except nv.NVMLError as exc:
            raise DiscoveryError(f"NVML: {exc}") from None
        return out

    def mig_driver(self) -> MigDriver:
        """:class:`~hami.deviceplugin.mignvml.NvmlMig` over the handles of :meth:`devices`."""
        if not self._handles:
            self.devices()
        return NvmlMig(self.nv, self._handles.__getitem__)

    def _ensure_event_set(self) -> None:
        nv = self.nv
        if self._event_set is not None:
            return
        if not self._handles:
            self.devices()
        self._event_set = nv.nvmlEventSetCreate()
        for uuid, h in self._handles.items():
            try:
                supported = nv.nvmlDeviceGetSupportedEventTypes(h) & EVENT_MASK
                nv.nvmlDeviceRegisterEvents(h, supported, self._event_set)
            except nv.NVMLError as exc:
                log.warning("health events unavailable for %s: %s", uuid, exc)

    def wait_event(self, timeout_s: float) -> HealthEvent | None:
        nv = self.nv
        self._ensure_event_set()
        try:
            data = nv.nvmlEventSetWait_v2(self._event_set, int(timeout_s * 1000))
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) == nv.NVML_ERROR_TIMEOUT:
                return None
            return HealthEvent(None, EVENT_XID_CRITICAL, 0)
        try:
            uuid: str | None = _text(nv.nvmlDeviceGetUUID(data.device))
        except nv.NVMLError:
            uuid = ""
        return HealthEvent(uuid, int(data.eventType), int(data.eventData))

    def close(self) -> None:
        try:
            if self._event_set is not None:
                self.nv.nvmlEventSetFree(self._event_set)
            self.nv.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down anyway
            pass


#: The ``--backend`` values of the node agents: real GPUs through NVML, or a YAML
#: inventory (tests and the docs' walkthroughs).
BACKENDS: tuple[str, ...] = ("nvml", "fake")


def open_backend(kind: str, inventory: Path | None) -> GpuBackend:
    """``kind`` is ``nvml`` or ``fake`` (then ``inventory`` is required)."""
    if kind == "fake":
        if inventory is None:
            raise DiscoveryError("--fake-inventory is required with --backend fake")
        return FakeBackend(inventory)
    if kind == "nvml":
        return NvmlBackend()
    raise DiscoveryError(f"unknown backend {kind!r} ({' | '.join(BACKENDS)})")


def filter_gpus(gpus: Iterable[PhysicalGpu], uuids: frozenset[str],
                indices: frozenset[int]) -> list[PhysicalGpu]:
    """Drop GPUs named by ``filterdevices`` (by UUID or NVML index, HAMi v2.10)."""
    return [g for g in gpus if g.uuid not in uuids and g.index not in indices]


def env_flag(name: str) -> str:
    """``os.environ[name]`` or ``""`` (for the shells)."""
    return os.environ.get(name, "")
