"""Per-node fragment statistics of a cluster, kept up to date incrementally.

:class:`FragmentationState` caches, per node, the sufficient statistics of the measure in
:mod:`hami.core.fragmentation.measure`: ``T`` (free GPU), ``S[k]`` (free GPU on GPUs too
small for class ``k``), ``C[k]`` (GPUs usable by ``k``) and ``F`` (expected
fragmentation), refreshed only for the nodes whose usage changed, so a replay pays
O(changed nodes x GPUs x K) per decision. :func:`ledger_inputs` reads the arrays it needs
from a :class:`~hami.core.ledger.UsageLedger`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hami.core.fragmentation.measure import (
    WHOLE,
    BoolArray,
    FloatArray,
    IntArray,
    WorkloadDistribution,
    Workspace,
    class_terms,
    distinct_shares,
    frag_delta,
    fragment,
    model_mask,
    share_after,
)
from hami.core.fragmentation.scalar import Classes, NodeRow, node_row
from hami.core.fragmentation.shares import (
    SlotTable,
    least_share_after,
    least_share_after_all,
    whole_after_all,
)

#: Up to this many changed nodes are refreshed one by one in plain Python
#: (:mod:`~hami.core.fragmentation.scalar`), more at once with numpy.
FEW_NODES = 4


class FragmentationState:
    """Per-node fragment statistics of a cluster, refreshed incrementally.

    Inputs are the ledger-style arrays: per device ``free_milli`` and ``node_of``; per
    node ``cpu_free``/``mem_free`` (use a large number when unchecked) and the node's GPU
    type. :meth:`refresh` recomputes only the nodes whose inputs changed since the last
    call, so a replay pays O(changed nodes x GPUs x K) per decision.
    """

    def __init__(self, dist: WorkloadDistribution, node_types: Sequence[str]) -> None:
        self.dist = dist
        #: ``dist``'s columns as Python numbers, for the nodes refreshed one by one.
        self.classes = Classes.of(dist)
        self.node_types = list(node_types)
        self.models_ok = model_mask(self.node_types, dist)
        n = len(node_types)
        #: Every node's terms are stale (the mix changed); recomputed at the next refresh.
        self._all_stale = False
        self.total = np.zeros(n)
        self.s = np.zeros((n, dist.size))
        self.c = np.zeros((n, dist.size))
        self.frag = np.zeros(n)
        self._free: IntArray | None = None
        #: ``(ledger version, ledger usage_seq)`` at the last :meth:`refresh_from_ledger`.
        self._seen: tuple[int, int] | None = None
        self._dev_order = np.zeros(0, dtype=np.int64)
        self._ptr = np.zeros(n + 1, dtype=np.int64)
        self._ptr_list: list[int] = [0] * (n + 1)
        #: Per node, ``(node_version, row)``: its state as Python numbers (:meth:`row`).
        self._rows: dict[int, tuple[int, NodeRow]] = {}
        self._slots: SlotTable | None = None
        self.node_of: IntArray = np.zeros(0, dtype=np.int64)
        #: Bumped for a node each time its statistics change (drives callers' caches).
        self.node_version = np.zeros(n, dtype=np.int64)
        self.cpu_free = np.zeros(n, dtype=np.int64)
        self.mem_free = np.zeros(n, dtype=np.int64)
        self._work = Workspace()

    def set_distribution(self, dist: WorkloadDistribution) -> None:
        """Change the task mix, keeping what does not depend on it (the devices' free
        shares, the nodes' CPU and memory, the device index): every node's terms are
        recomputed, vectorised, at the next :meth:`refresh` or
        :meth:`refresh_from_ledger`, as a new state would compute them."""
        self.dist = dist
        self.classes = Classes.of(dist)
        self.models_ok = model_mask(self.node_types, dist)
        n = self.total.shape[0]
        self.s = np.zeros((n, dist.size))
        self.c = np.zeros((n, dist.size))
        self._all_stale = True

    def refresh(self, free_milli: IntArray, node_of: IntArray, cpu_free: IntArray,
                mem_free: IntArray) -> None:
        """Bring the cached terms up to date with the given arrays (any change allowed,
        node set included); only nodes whose inputs differ are recomputed."""
        n = self.total.shape[0]
        rebuilt = (self._free is None or self._free.shape != free_milli.shape
                   or not np.array_equal(self.node_of, node_of))
        if rebuilt:
            changed_nodes = np.arange(n)
            self.node_of = node_of.copy()
            self._index_devices()
        else:
            dev_changed = self._free != free_milli
            changed = np.zeros(n, dtype=np.bool_)
            nodes = node_of[dev_changed]
            changed[nodes[nodes >= 0]] = True
            changed |= (self.cpu_free != cpu_free) | (self.mem_free != mem_free)
            changed_nodes = np.flatnonzero(changed)
        self._free = free_milli.copy()
        if self._slots is not None:  # a new device index fills its table now
            if rebuilt:
                self._slots.fill(self._free)
            else:
                self._slots.fresh = False
        self.cpu_free = cpu_free.copy()
        self.mem_free = mem_free.copy()
        self._update_nodes(np.arange(n) if self._all_stale else changed_nodes)
        self._all_stale = False

    def _index_devices(self) -> None:
        """Devices grouped by node: ``_dev_order[_ptr[i]:_ptr[i + 1]]`` are node ``i``'s."""
        n = self.total.shape[0]
        valid = np.flatnonzero(self.node_of >= 0)
        self._dev_order = valid[np.argsort(self.node_of[valid], kind="stable")]
        counts = np.bincount(self.node_of[valid], minlength=n)[:n]
        self._ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._ptr_list = self._ptr.tolist()
        self._slots = SlotTable(self._dev_order, self._ptr)

    def devices_of(self, nodes: IntArray) -> IntArray:
        """Device indices of ``nodes`` (concatenated in node order)."""
        if nodes.size == 1:
            i = int(nodes[0])
            result: IntArray = self._dev_order[self._ptr[i]:self._ptr[i + 1]]
            return result
        return np.concatenate([self._dev_order[self._ptr[i]:self._ptr[i + 1]]
                               for i in nodes.tolist()] or [np.zeros(0, np.int64)])

    def _update_nodes(self, changed_nodes: IntArray) -> None:
        if changed_nodes.size == 0:
            return
        assert self._free is not None
        if changed_nodes.size <= FEW_NODES:
            ptr, dev_order, free = self._ptr_list, self._dev_order, self._free
            for i in changed_nodes.tolist():
                self._set_row(i, free[dev_order[ptr[i]:ptr[i + 1]]].tolist())
            return
        self.node_version[changed_nodes] += 1
        n = self.total.shape[0]
        if changed_nodes.size == n:
            sel = np.flatnonzero(self.node_of >= 0)
            local = self.node_of[sel]
        elif changed_nodes.size == 1:
            sel = self.devices_of(changed_nodes)
            local = np.zeros(sel.size, dtype=np.int64)
        else:
            sel = self.devices_of(changed_nodes)
            pos = np.full(n, -1, dtype=np.int64)
            pos[changed_nodes] = np.arange(changed_nodes.size)
            local = pos[self.node_of[sel]]
        total, s, c = class_terms(self._free[sel], local, changed_nodes.size, self.dist)
        self.total[changed_nodes] = total
        self.s[changed_nodes] = s
        self.c[changed_nodes] = c
        self.frag[changed_nodes] = fragment(
            total, s, c, self.cpu_free[changed_nodes], self.mem_free[changed_nodes],
            self.models_ok[changed_nodes], self.dist) @ self.dist.weight

    def _set_row(self, i: int, free: list[int]) -> None:
        """Node ``i``'s terms from its GPUs' free shares, in plain Python."""
        row = node_row(free, int(self.cpu_free[i]), int(self.mem_free[i]),
                       self.models_ok[i].tolist(), self.classes)
        version = int(self.node_version[i]) + 1
        self.node_version[i] = version
        self.total[i], self.s[i], self.c[i], self.frag[i] = row.total, row.s, row.c, row.frag
        self._rows[i] = (version, row)

    def row(self, i: int) -> NodeRow:
        """Node ``i``'s current state and terms as Python numbers (kept per node version)."""
        version = int(self.node_version[i])
        hit = self._rows.get(i)
        if hit is not None and hit[0] == version:
            return hit[1]
        assert self._free is not None
        devices = self._dev_order[self._ptr_list[i]:self._ptr_list[i + 1]]
        row = NodeRow(tuple(self._free[devices].tolist()), int(self.cpu_free[i]),
                      int(self.mem_free[i]), tuple(self.models_ok[i].tolist()),
                      float(self.total[i]), tuple(self.s[i].tolist()),
                      tuple(self.c[i].tolist()), float(self.frag[i]))
        self._rows[i] = (version, row)
        return row

    def refresh_from_ledger(self, ledger: Any) -> None:
        """:meth:`refresh` reading a :class:`~hami.core.ledger.UsageLedger`, cheaply.

        Changed nodes are those the ledger stamped since the last call
        (``UsageLedger.changed_nodes``) and only their devices are re-read; the first call
        reads everything.
        """
        version = ledger.version
        if self._free is None or self._seen is None or self._seen[0] != version:
            self._seen = (version, ledger.usage_seq)
            self.refresh(*ledger_inputs(ledger))
            return
        seq = ledger.usage_seq
        changed = (ledger.changed_nodes(self._seen[1]) if seq != self._seen[1]
                   else np.zeros(0, dtype=np.int64))
        self._seen = (version, seq)
        if changed.size == 0:
            if self._all_stale:
                self._update_nodes(np.arange(self.total.shape[0]))
                self._all_stale = False
            return
        if changed.size <= FEW_NODES and not self._all_stale:
            self._refresh_few(ledger, changed.tolist())
            return
        devs = self.devices_of(changed)
        total_cores = np.maximum(ledger.total_cores[devs], 1)
        free = (ledger.total_cores[devs] - ledger.used_cores[devs]) * 1000 // total_cores
        usable = ledger.healthy[devs] & (ledger.used_slots[devs] < ledger.split_count[devs])
        self._free[devs] = np.where(usable, free, 0)
        if self._slots is not None:
            self._slots.fresh = False
        for arr, total_arr, used in ((self.cpu_free, ledger.cpu_milli_total,
                                      ledger.cpu_milli_used),
                                     (self.mem_free, ledger.memory_mib_total,
                                      ledger.memory_mib_used)):
            t = total_arr[changed]
            arr[changed] = np.where(t < 0, UNLIMITED, t - used[changed])
        self._update_nodes(np.arange(self.total.shape[0]) if self._all_stale else changed)
        self._all_stale = False

    def _refresh_few(self, ledger: Any, nodes: list[int]) -> None:
        """:meth:`refresh_from_ledger` for a few changed ``nodes``, one by one in plain
        Python (the same free shares, free CPU and memory, and terms)."""
        assert self._free is not None
        ptr, dev_order = self._ptr_list, self._dev_order
        for i in nodes:
            devs = dev_order[ptr[i]:ptr[i + 1]]
            free = [(cores - used) * 1000 // max(cores, 1) if healthy and slots < split else 0
                    for cores, used, healthy, slots, split in zip(
                        ledger.total_cores[devs].tolist(), ledger.used_cores[devs].tolist(),
                        ledger.healthy[devs].tolist(), ledger.used_slots[devs].tolist(),
                        ledger.split_count[devs].tolist(), strict=True)]
            self._free[devs] = free
            if self._slots is not None and self._slots.fresh:
                self._slots.set_node(i, free)
            cpu_total, mem_total = int(ledger.cpu_milli_total[i]), int(ledger.memory_mib_total[i])
            self.cpu_free[i] = (UNLIMITED if cpu_total < 0
                                else cpu_total - int(ledger.cpu_milli_used[i]))
            self.mem_free[i] = (UNLIMITED if mem_total < 0
                                else mem_total - int(ledger.memory_mib_used[i]))
            self._set_row(i, free)

    def delta_nodes(self, nodes: IntArray, *, request_milli: int, num_gpu: int,
                    cpu_milli: int, memory_mib: int) -> FloatArray:
        """:func:`frag_delta` for whole-GPU or CPU-only requests, one value per node."""
        return frag_delta(self.total[nodes], self.s[nodes], self.c[nodes], self.frag[nodes],
                          self.cpu_free[nodes], self.mem_free[nodes], self.models_ok[nodes],
                          self.dist, request_milli=request_milli, num_gpu=num_gpu,
                          cpu_milli=cpu_milli, memory_mib=memory_mib)

    def delta_all(self, *, request_milli: int, num_gpu: int, cpu_milli: int,
                  memory_mib: int) -> FloatArray:
        """:meth:`delta_nodes` of every node, computed class-major
        (:func:`whole_after_all`)."""
        after = whole_after_all(self.total, self.s, self.c,
                                self._host_after(cpu_milli, memory_mib), self.dist,
                                request_milli=request_milli, num_gpu=num_gpu, work=self._work)
        grown: FloatArray = np.round(after - self.frag, 6)
        return grown

    def delta_devices(self, devices: IntArray, node_of: IntArray, device_free: IntArray, *,
                      request_milli: int, cpu_milli: int, memory_mib: int) -> FloatArray:
        """:func:`frag_delta` for a GPU-share request, one value per candidate device."""
        nodes = node_of[devices]
        return frag_delta(self.total[nodes], self.s[nodes], self.c[nodes], self.frag[nodes],
                          self.cpu_free[nodes], self.mem_free[nodes], self.models_ok[nodes],
                          self.dist, request_milli=request_milli, num_gpu=1,
                          cpu_milli=cpu_milli, memory_mib=memory_mib,
                          device_free=device_free[devices].astype(np.float64))

    def least_share_all(self, *, request_milli: int, cpu_milli: int,
                        memory_mib: int) -> FloatArray | None:
        """``[N]``: per node the least :meth:`delta_devices` of a GPU share over all its
        GPUs with at least ``request_milli`` free (``inf`` for a node without one),
        computed for the whole cluster at once (:func:`least_share_after_all`); None
        when the free shares do not suit that (then :meth:`least_share_delta`)."""
        assert self._free is not None and self._slots is not None
        least_after = least_share_after_all(
            self._slots, self._free, self.total, self.s, self.c,
            self._host_after(cpu_milli, memory_mib), self.dist, request_milli=request_milli,
            work=self._work)
        if least_after is None:
            return None
        grown: FloatArray = np.round(least_after - self.frag, 6)  # inf stays inf
        return grown

    def least_share_delta(self, devices: IntArray, *, request_milli: int, cpu_milli: int,
                          memory_mib: int) -> tuple[IntArray, FloatArray]:
        """For a GPU share, per node the least :meth:`delta_devices` over ``devices``
        (ledger device indices, each with at least ``request_milli`` free).

        Returns ``(nodes, least)``, the nodes ascending. Devices of one node with the same
        free share grow fragmentation alike, so each (node, free share) is computed once
        (:func:`share_delta`); the values are those of :meth:`delta_devices`.
        """
        assert self._free is not None
        nodes = self.node_of[devices]
        free = self._free[devices]
        if devices.size < 64 or free.min() < 0 or free.max() > WHOLE:
            deltas = self.delta_devices(devices, self.node_of, self._free,
                                        request_milli=request_milli, cpu_milli=cpu_milli,
                                        memory_mib=memory_mib)
            order = np.argsort(nodes, kind="stable")
            nodes, deltas = nodes[order], deltas[order]
        else:
            values, of_value = distinct_shares(free)
            n, v = self.total.shape[0], values.size
            host = self._host_after(cpu_milli, memory_mib)
            if n * v <= 8 * devices.size:  # a [shares, nodes] table, every node at once
                lacks = np.bincount(of_value * n + nodes, minlength=v * n)[:v * n] == 0
                least_after = least_share_after(self.total, self.s, self.c, host, self.dist,
                                                values, lacks.reshape(v, n),
                                                request_milli=request_milli, work=self._work)
            else:  # many distinct shares: one row per (node, share), found by sorting
                keys = np.unique(nodes * (WHOLE + 1) + free)
                nodes, free = keys // (WHOLE + 1), keys % (WHOLE + 1)
                after = share_after(self.total, self.s, self.c, host, self.dist, nodes, free,
                                    request_milli=request_milli, work=self._work)
                least_after = np.full(n, np.inf)
                np.minimum.at(least_after, nodes, after)
            # The least growth is the least F_n after, less F_n before, rounded: both
            # steps keep the order, so as the least of the rounded growths per row.
            found = np.flatnonzero(least_after < np.inf)
            grown: FloatArray = np.round(least_after[found] - self.frag[found], 6)
            return found, grown
        first = np.empty(nodes.size, dtype=np.bool_)
        first[:1] = True
        np.not_equal(nodes[1:], nodes[:-1], out=first[1:])
        starts = np.flatnonzero(first)
        least: FloatArray = np.minimum.reduceat(deltas, starts)
        return nodes[starts], least

    def _host_after(self, cpu_milli: int, memory_mib: int) -> BoolArray:
        """``[N, K]``: class ``k`` accepts node ``n``'s GPU model and fits its CPU and
        memory once ``cpu_milli``/``memory_mib`` more are used there (the transpose of a
        ``[K, N]`` array: :func:`share_delta` reads it class-major)."""
        d = self.dist
        ok: BoolArray = (self.cpu_free - cpu_milli)[None, :] >= d.cpu_milli[:, None]
        ok &= (self.mem_free - memory_mib)[None, :] >= d.memory_mib[:, None]
        ok &= self.models_ok.T
        return ok.T


#: A CPU or memory capacity the ledger does not check (``-1``) counts as unlimited.
UNLIMITED = 2**40


def ledger_inputs(ledger: Any, nodes: IntArray | None = None
                  ) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    """``(free_milli, node_of, cpu_free, mem_free)`` from a :class:`UsageLedger`.

    A GPU's free share is its free compute in milli-GPU (``1000 x`` free cores over the
    card's cores), 0 for an unhealthy or removed GPU or one with no task slot left. With
    ``nodes`` given, only the devices of those nodes are computed (others read 0).
    """
    n, count = ledger.size, ledger.node_count
    node_of = ledger.node_of[:n]
    free = np.zeros(n, dtype=np.int64)
    sel = slice(None) if nodes is None else np.flatnonzero(np.isin(node_of, nodes))
    total_cores = np.maximum(ledger.total_cores[:n][sel], 1)
    part = (ledger.total_cores[:n][sel] - ledger.used_cores[:n][sel]) * 1000 // total_cores
    usable = ledger.healthy[:n][sel] & (ledger.used_slots[:n][sel]
                                        < ledger.split_count[:n][sel])
    free[sel] = np.where(usable, part, 0)
    cpu_t, mem_t = ledger.cpu_milli_total[:count], ledger.memory_mib_total[:count]
    cpu_free = np.where(cpu_t < 0, UNLIMITED, cpu_t - ledger.cpu_milli_used[:count])
    mem_free = np.where(mem_t < 0, UNLIMITED, mem_t - ledger.memory_mib_used[:count])
    return free, node_of, cpu_free, mem_free


def node_types(ledger: Any) -> list[str]:
    """Per ledger node, the type name of its GPUs (its first device's; ``""`` without)."""
    types = [""] * ledger.node_count
    node_of = ledger.node_of[:ledger.size]
    valid = np.flatnonzero(node_of >= 0)
    nodes, first = np.unique(node_of[valid], return_index=True)  # lowest device per node
    names = ledger.type_names
    for i, t in zip(nodes.tolist(), ledger.type_id[valid[first]].tolist(), strict=True):
        types[i] = names[t]
    return types
