"""The usage ledger's columnar store: flat numpy arrays over every device and every node,
and what readers derive from them.

:class:`LedgerArrays` owns the arrays (device ``d`` belongs to node ``node_of[d]``; node
``i`` is named ``node_name(i)``), grows them by doubling, numbers device types and
vendors, stamps the nodes whose usage changes (:meth:`LedgerArrays.changed_nodes`) and
computes HAMi's node score (HAMi v2.10). Which node and which pod own which rows, and how
a pod's grant is charged to them, is :class:`hami.core.ledger.UsageLedger`'s part.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: Per-device integer arrays, in the order they are allocated.
DEVICE_FIELDS = ("total_memory_mib", "used_memory_mib", "total_cores", "used_cores",
                 "split_count", "used_slots", "node_of", "numa", "type_id", "vendor_id")
#: Per-device boolean arrays.
DEVICE_FLAGS = ("healthy", "registered_healthy", "mig_mode")
#: Per-node integer arrays.
NODE_FIELDS = ("cpu_milli_total", "cpu_milli_used", "memory_mib_total", "memory_mib_used",
               "sum_split", "sum_used_slots", "sum_total_cores", "sum_used_cores",
               "sum_total_memory", "sum_used_memory", "usage_stamp")


class LedgerArrays:
    """Per-device and per-node arrays of a ledger (length :attr:`size` and
    :attr:`node_count` in use), with the caches derived from them.

    ``version`` is bumped when a node is added or removed; ``usage_seq`` whenever a
    node's usage or CPU/memory capacity changes, the node's ``usage_stamp`` taking the
    new value.
    """

    def __init__(self, capacity: int = 64) -> None:
        self.size = 0
        self._dcap = capacity
        self._ncap = capacity
        for name in DEVICE_FIELDS + NODE_FIELDS:
            setattr(self, name, np.zeros(capacity, dtype=np.int64))
        #: Usable: registered healthy and not failed closed by a MIG mismatch (HAMi v2.10).
        self.healthy: BoolArray = np.zeros(capacity, dtype=np.bool_)
        #: As registered by the device plugin.
        self.registered_healthy: BoolArray = np.zeros(capacity, dtype=np.bool_)
        self.mig_mode: BoolArray = np.zeros(capacity, dtype=np.bool_)
        self.node_active: BoolArray = np.zeros(capacity, dtype=np.bool_)
        self._node_names: list[str] = []
        self._types: dict[str, int] = {}
        self.type_names: list[str] = []
        #: CommonWord -> the small integer in :attr:`vendor_id`.
        self._vendor_ids: dict[str, int] = {}
        self._vendor_counts: tuple[int, dict[str, tuple[BoolArray, IntArray]]] = (-1, {})
        self._mig_rows = (-1, False)
        #: Caches that readers derive from this ledger, by reader; each checks itself
        #: against :attr:`version` and :attr:`usage_seq` (e.g. the prefilter's counts).
        self.derived: dict[str, Any] = {}
        self.version = 0
        #: Bumped whenever a node's usage or CPU/memory capacity changes; the node's
        #: ``usage_stamp`` takes the new value, so a reader that kept the value it last saw
        #: finds the changed nodes as ``usage_stamp > seen`` (a node added or removed
        #: bumps :attr:`version` instead).
        self.usage_seq = 0

    # Arrays are declared for the type checker; they are created in __init__.
    total_memory_mib: IntArray
    used_memory_mib: IntArray
    total_cores: IntArray
    used_cores: IntArray
    split_count: IntArray
    used_slots: IntArray
    node_of: IntArray
    numa: IntArray
    type_id: IntArray
    vendor_id: IntArray
    cpu_milli_total: IntArray
    cpu_milli_used: IntArray
    memory_mib_total: IntArray
    memory_mib_used: IntArray
    sum_split: IntArray
    sum_used_slots: IntArray
    sum_total_cores: IntArray
    sum_used_cores: IntArray
    sum_total_memory: IntArray
    sum_used_memory: IntArray
    usage_stamp: IntArray

    # ---------------------------------------------------------------- layout
    @property
    def node_count(self) -> int:
        """Number of node indices handed out (including removed ones)."""
        return len(self._node_names)

    def node_name(self, index: int) -> str:
        """Name of node ``index``."""
        return self._node_names[index]

    def _new_node_index(self, name: str) -> int:
        """Hand out the next node index to ``name``, growing the node arrays."""
        index = len(self._node_names)
        self._node_names.append(name)
        if index >= self._ncap:
            self._ncap *= 2
            self._grow((*NODE_FIELDS, "node_active"), self._ncap)
        return index

    def _new_rows(self, count: int) -> int:
        """Append ``count`` device rows, growing the device arrays; returns the first."""
        while self.size + count > self._dcap:
            self._dcap *= 2
            self._grow((*DEVICE_FIELDS, *DEVICE_FLAGS), self._dcap)
        offset = self.size
        self.size += count
        return offset

    def _grow(self, fields: Sequence[str], cap: int) -> None:
        for name in fields:
            old = getattr(self, name)
            new = np.zeros(cap, dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    def type_index(self, type_name: str) -> int:
        """A small integer for a device type string (stable for the ledger's life)."""
        idx = self._types.get(type_name)
        if idx is None:
            idx = self._types[type_name] = len(self.type_names)
            self.type_names.append(type_name)
        return idx

    def _vendor_index(self, vendor: str) -> int:
        return self._vendor_ids.setdefault(vendor, len(self._vendor_ids))

    # ---------------------------------------------------- derived, by version
    def vendor_rows(self, vendor: str) -> BoolArray:
        """Per device row (length :attr:`size`): registered to ``vendor`` (a CommonWord);
        cached until a node is added or removed (do not modify)."""
        return self._vendor_cache(vendor)[0]

    def vendor_device_counts(self, vendor: str) -> IntArray:
        """Per node index (length :attr:`node_count`): how many devices of ``vendor`` (a
        CommonWord) the node registered; cached like :meth:`vendor_rows`."""
        return self._vendor_cache(vendor)[1]

    def _vendor_cache(self, vendor: str) -> tuple[BoolArray, IntArray]:
        version, cache = self._vendor_counts
        if version != self.version:
            cache = {}
            self._vendor_counts = (self.version, cache)
        hit = cache.get(vendor)
        if hit is None:
            n = self.size
            rows = (self.vendor_id[:n] == self._vendor_ids.get(vendor, -1)) & (self.node_of[:n] >= 0)
            hit = cache[vendor] = (rows, np.bincount(self.node_of[:n][rows],
                                                     minlength=self.node_count))
        return hit

    def has_mig_rows(self) -> bool:
        """True when some registered device is in MIG mode (cached until a node is added
        or removed)."""
        if self._mig_rows[0] != self.version:
            n = self.size
            self._mig_rows = (self.version,
                              bool((self.mig_mode[:n] & (self.node_of[:n] >= 0)).any()))
        return self._mig_rows[1]

    # ----------------------------------------------------------- usage stamps
    def _stamp(self, index: int) -> None:
        self.usage_seq += 1
        self.usage_stamp[index] = self.usage_seq

    def changed_nodes(self, seen: int) -> IntArray:
        """Node indices whose usage or CPU/memory capacity changed after
        :attr:`usage_seq` was ``seen`` (ascending)."""
        return np.flatnonzero(self.usage_stamp[: self.node_count] > seen)

    # ------------------------------------------------------------ node score
    def node_score(self, index: int) -> float:
        """:meth:`node_scores` of one node."""
        split, cores = int(self.sum_split[index]), int(self.sum_total_cores[index])
        mem = int(self.sum_total_memory[index])
        if split <= 0 or cores <= 0 or mem <= 0:
            return 0.0
        return 10.0 * (int(self.sum_used_slots[index]) / split
                       + int(self.sum_used_cores[index]) / cores
                       + int(self.sum_used_memory[index]) / mem)

    def node_scores(self) -> npt.NDArray[np.float64]:
        """HAMi's node score for every node index (HAMi v2.10 step 3):
        ``10 x (used slots/slots + used cores/cores + used memory/memory)``, 0 when a
        denominator is 0."""
        n = self.node_count
        split, cores, mem = (self.sum_split[:n], self.sum_total_cores[:n],
                             self.sum_total_memory[:n])
        valid = (split > 0) & (cores > 0) & (mem > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            score = 10.0 * (self.sum_used_slots[:n] / split + self.sum_used_cores[:n] / cores
                            + self.sum_used_memory[:n] / mem)
        return np.where(valid, score, 0.0)
