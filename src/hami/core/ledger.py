"""The usage ledger: every registered GPU's capacity and usage, kept incrementally.

Source (HAMi v2.10): (which pods count and how) and HAMi v2.10.
HAMi rebuilds per-node usage from every cached pod on each filter; here a pod is charged
once when it is added and released once when it is removed, so a filter decision costs
O(candidate nodes x GPUs) however many pods run.

Layout (:mod:`hami.core.ledger_arrays`): flat numpy arrays over all devices of all nodes
(device ``d`` belongs to node ``node_of[d]``), grown by doubling; a removed node leaves a
hole (``node_of = -1``, unhealthy) that is never a candidate, and a node that registers
again (a health flip, a re-added Node) takes its own index and rows back when its devices
fit in them. Per node, sums for the node score and optional CPU/memory capacity (the
simulator sets them; the live extender leaves them to kube-scheduler). This module keeps
which node and which pod own which rows and charges a pod's grant to them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from hami.core.collapse import app_only_charges, pod_charges
from hami.core.ledger_arrays import IntArray, LedgerArrays
from hami.core.migbook import MigBook
from hami.core.model import DeviceCharge, DeviceInfo, MigPlacement, PodSingleDevice


@dataclass(slots=True)
class NodeEntry:
    """One registered node: its devices and where they sit in the flat arrays."""

    name: str
    index: int
    devices: tuple[DeviceInfo, ...]
    offset: int
    annotations: dict[str, str] = field(default_factory=dict)
    position: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class PodEntry:
    """A pod holding devices: where, what it was granted, and what it is charged."""

    uid: str
    namespace: str
    name: str
    node: str
    devices: PodSingleDevice
    n_init: int
    charges: tuple[DeviceCharge, ...]
    cpu_milli: int = 0
    memory_mib: int = 0
    shrunk: bool = False
    #: MIG instances the pod holds: ``(gpu uuid, placement)`` (HAMi v2.10).
    mig: tuple[tuple[str, MigPlacement], ...] = ()
    #: Positions of the sidecars (restartable init containers) among the first ``n_init``:
    #: charged for the pod's whole life (:mod:`hami.core.collapse`).
    sidecars: frozenset[int] = frozenset()


class UsageLedger(LedgerArrays):
    """Per-device used memory, cores and task slots over a cluster, updated per pod.

    Nodes: :meth:`add_node` (also re-registration), :meth:`remove_node`. Pods:
    :meth:`add_pod`, :meth:`remove_pod`, :meth:`shrink_pod` (init containers finished).
    Readers use the public arrays (``total_memory_mib`` ... ``type_id``, length
    :attr:`size`) and :meth:`node`, :meth:`device_usage`.
    """

    def __init__(self, capacity: int = 64) -> None:
        super().__init__(capacity)
        self._nodes: dict[str, NodeEntry] = {}
        self._index_of: dict[str, int] = {}
        self._pods: dict[str, PodEntry] = {}
        self._pods_on: dict[str, set[str]] = {}
        #: MIG reservations and fail-closed GPUs per device row (HAMi v2.10).
        self._migbook = MigBook()
        #: Removed nodes' node index and device rows ``(index, offset, count)``, reused
        #: when the same node registers again.
        self._vacated: dict[str, tuple[int, int, int]] = {}
        self._active = (-1, np.zeros(0, dtype=np.int64))
        #: Bumped on every pod addition or removal (cheap "has the mix changed" signal).
        self.version_pods = 0

    # ----------------------------------------------------------------- nodes
    def node_names(self) -> list[str]:
        """Names of the registered nodes, in registration order."""
        return [n for n in self._node_names if n in self._nodes]

    def node(self, name: str) -> NodeEntry | None:
        """The node's entry, or None when it is not registered."""
        return self._nodes.get(name)

    def indices(self, names: Sequence[str] | None) -> IntArray:
        """Node indices for ``names`` (-1 for names not registered); None: every node
        (a read-only array, kept until a node is added or removed)."""
        if names is None:
            if self._active[0] != self.version:
                active = np.flatnonzero(self.node_active[: self.node_count]).astype(np.int64)
                active.flags.writeable = False
                self._active = (self.version, active)
            return self._active[1]
        get = self._index_of.get
        return np.array([get(n, -1) for n in names], dtype=np.int64)

    def node_rows(self, indices: IntArray) -> IntArray | slice:
        """Device rows of the registered nodes among ``indices``, node by node (a slice
        when they are one node's: indexing by it is cheaper)."""
        spans = [(e.offset, e.offset + len(e.devices)) for i in indices.tolist()
                 if (e := self._nodes.get(self._node_names[i])) is not None]
        if len(spans) == 1:
            return slice(*spans[0])
        return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in spans]
                              or [np.zeros(0, dtype=np.int64)])

    def add_node(self, name: str, devices: Sequence[DeviceInfo], *,
                 cpu_milli: int | None = None, memory_mib: int | None = None,
                 annotations: Mapping[str, str] | None = None) -> None:
        """Register (or re-register) a node's devices.

        ``cpu_milli``/``memory_mib`` None means "not checked here". Re-registration with
        the same devices keeps usage; with different devices the node's usage is rebuilt
        from the pods on it (charges for UUIDs the node no longer has are ignored).
        """
        devices = tuple(devices)
        old = self._nodes.get(name)
        if old is not None and old.devices == devices:
            old.annotations = dict(annotations or {})
            self._set_node_capacity(old.index, cpu_milli, memory_mib)
            return
        rows: tuple[int, int] | None = None  # (offset, count) this node held before
        if old is not None:
            self._drop_devices(old)
            index, rows = old.index, (old.offset, len(old.devices))
        elif name in self._vacated:
            index, *held = self._vacated.pop(name)
            rows = (held[0], held[1])
        else:
            index = self._new_node_index(name)
        if rows is not None and len(devices) <= rows[1]:
            # The node's own rows again (a health flip re-registers the same GPUs), so a
            # flapping node does not grow the arrays; spare rows stay unusable holes.
            offset = rows[0]
        else:
            offset = self._new_rows(len(devices))
        entry = NodeEntry(name, index, devices, offset, dict(annotations or {}))
        for i, dev in enumerate(devices):
            d = offset + i
            entry.position[dev.uuid] = d
            self.total_memory_mib[d] = dev.memory_mib
            self.total_cores[d] = dev.cores_percent
            self.split_count[d] = dev.split_count
            self.used_memory_mib[d] = self.used_cores[d] = self.used_slots[d] = 0
            self.node_of[d] = index
            self.numa[d] = dev.numa
            self.type_id[d] = self.type_index(dev.type)
            self.vendor_id[d] = self._vendor_index(dev.vendor)
            self.healthy[d] = self.registered_healthy[d] = dev.health
            self.mig_mode[d] = dev.mode == "mig"
        self._nodes[name] = entry
        self._index_of[name] = index
        self.node_active[index] = True
        self.sum_split[index] = sum(d.split_count for d in devices)
        self.sum_total_cores[index] = sum(d.cores_percent for d in devices)
        self.sum_total_memory[index] = sum(d.memory_mib for d in devices)
        for field_name in ("sum_used_slots", "sum_used_cores", "sum_used_memory",
                           "cpu_milli_used", "memory_mib_used"):
            getattr(self, field_name)[index] = 0
        self._set_node_capacity(index, cpu_milli, memory_mib)
        for uid in self._pods_on.get(name, ()):
            self._apply(self._pods[uid], +1)
        self.version += 1

    def _set_node_capacity(self, index: int, cpu_milli: int | None,
                           memory_mib: int | None) -> None:
        self.cpu_milli_total[index] = -1 if cpu_milli is None else cpu_milli
        self.memory_mib_total[index] = -1 if memory_mib is None else memory_mib
        self._stamp(index)

    def _drop_devices(self, entry: NodeEntry) -> None:
        span = slice(entry.offset, entry.offset + len(entry.devices))
        self._migbook.drop(range(span.start, span.stop))
        self.healthy[span] = self.registered_healthy[span] = False
        self.node_of[span] = -1
        self.split_count[span] = 0

    def remove_node(self, name: str) -> None:
        """Forget a node. Pods on it stay known and count again if it comes back."""
        entry = self._nodes.pop(name, None)
        if entry is None:
            return
        self._drop_devices(entry)
        self._vacated[name] = (entry.index, entry.offset, len(entry.devices))
        self._index_of.pop(name, None)
        self.node_active[entry.index] = False
        self.version += 1

    # ------------------------------------------------------------------ pods
    def pod(self, uid: str) -> PodEntry | None:
        """The pod's entry, or None."""
        return self._pods.get(uid)

    def pods(self) -> Iterable[PodEntry]:
        """Every pod holding devices."""
        return self._pods.values()

    def pods_on(self, node: str) -> list[PodEntry]:
        """Pods charged to ``node``."""
        return [self._pods[uid] for uid in self._pods_on.get(node, ())]

    def add_pod(self, uid: str, node: str, devices: PodSingleDevice, n_init: int = 0, *,
                namespace: str = "default", name: str = "", cpu_milli: int = 0,
                memory_mib: int = 0,
                mig: tuple[tuple[str, MigPlacement], ...] = (),
                sidecars: frozenset[int] = frozenset()) -> PodEntry:
        """Charge a pod's grant to ``node`` (replacing an earlier entry of the same uid).

        ``sidecars``: positions of the restartable init containers, whose usage is held
        beside the app containers'. Returns the new entry; its ``charges`` are the
        collapsed per-GPU usage.
        """
        self.remove_pod(uid)
        entry = PodEntry(uid, namespace, name, node, devices, n_init,
                         pod_charges(devices, n_init, sidecars), cpu_milli, memory_mib,
                         mig=mig, sidecars=sidecars)
        self._pods[uid] = entry
        self.version_pods += 1
        self._pods_on.setdefault(node, set()).add(uid)
        self._apply(entry, +1)
        return entry

    def put_pod(self, entry: PodEntry) -> None:
        """Charge an entry that :meth:`remove_pod` returned, as it was (the same object,
        its charges as they stand, shrunk or not), replacing any entry of its uid."""
        self.remove_pod(entry.uid)
        self._pods[entry.uid] = entry
        self.version_pods += 1
        self._pods_on.setdefault(entry.node, set()).add(entry.uid)
        self._apply(entry, +1)

    def remove_pod(self, uid: str) -> PodEntry | None:
        """Release a pod's charges; returns the removed entry, or None if unknown."""
        entry = self._pods.pop(uid, None)
        if entry is None:
            return None
        self.version_pods += 1
        self._apply(entry, -1)
        on = self._pods_on.get(entry.node)
        if on is not None:
            on.discard(uid)
            if not on:
                del self._pods_on[entry.node]
        return entry

    def shrink_pod(self, uid: str) -> tuple[PodEntry, PodEntry] | None:
        """Replace a pod's charges by its app containers' and sidecars' alone (ordinary
        init containers done).

        Returns ``(before, after)`` entries, or None when unknown or already shrunk.
        """
        entry = self._pods.get(uid)
        if entry is None or entry.shrunk:
            return None
        before = replace(entry)
        self._apply(entry, -1)
        entry.charges = app_only_charges(entry.devices, entry.n_init, entry.sidecars)
        entry.shrunk = True
        self._apply(entry, +1)
        return before, entry

    def _apply(self, entry: PodEntry, sign: int) -> None:
        node = self._nodes.get(entry.node)
        if node is None:
            return
        i = node.index
        self._stamp(i)
        if self.cpu_milli_total[i] >= 0:
            self.cpu_milli_used[i] += sign * entry.cpu_milli
        if self.memory_mib_total[i] >= 0:
            self.memory_mib_used[i] += sign * entry.memory_mib
        for c in entry.charges:
            d = node.position.get(c.uuid)
            if d is None:
                continue
            self.used_memory_mib[d] += sign * c.memory_mib
            self.used_cores[d] += sign * c.cores_percent
            self.used_slots[d] += sign * c.slots
            self.sum_used_memory[i] += sign * c.memory_mib
            self.sum_used_cores[i] += sign * c.cores_percent
            self.sum_used_slots[i] += sign * c.slots
        self._migbook.apply(entry, node, sign, self.mig_mode, self.registered_healthy,
                            self.healthy)

    # --------------------------------------------------------------- queries
    def device_usage(self, name: str) -> list[tuple[DeviceInfo, int, int, int]]:
        """``(device, used_slots, used_memory_mib, used_cores)`` for each GPU of a node."""
        entry = self._nodes[name]
        o = entry.offset
        rows = slice(o, o + len(entry.devices))
        faults = self._migbook.faults
        return [(replace(dev, health=False) if o + i in faults else dev, slots, memory, cores)
                for i, (dev, slots, memory, cores) in enumerate(zip(
                    entry.devices, self.used_slots[rows].tolist(),
                    self.used_memory_mib[rows].tolist(), self.used_cores[rows].tolist(),
                    strict=True))]

    def mig_faults(self, name: str) -> dict[str, tuple[str, ...]]:
        """GPUs of a node failed closed by MIG mismatches: UUID -> the pod uids (HAMi v2.10)."""
        return self._migbook.node_faults(self._nodes[name])

    def mig_occupied(self, name: str) -> dict[str, list[MigPlacement]]:
        """MIG placements in use per GPU UUID of a node (only GPUs that have some)."""
        return self._migbook.node_occupied(self._nodes[name])
