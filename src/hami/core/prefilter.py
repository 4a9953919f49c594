"""The vectorised prefilter: nodes that cannot host some container's request even alone.

A necessary condition of the exact fit (:mod:`hami.core.nodefit`), computed in one numpy
pass over the ledger's device rows, whatever vendor they belong to:

* a GPU-share request (``PodRequest.containers``, HAMi's NVIDIA rules) needs ``nums``
  devices each of which could hold it on its own (slots, memory, cores, exclusivity,
  type filters, MIG instances);
* any other vendor's request (``PodRequest.vendors``) needs ``nums`` of that vendor's
  devices that could each hold it, by the same share rules (without the NVIDIA type and
  policy filters) when the vendor's Fit follows them (``Vendor.share_prefilter``), else
  ``nums`` of its devices at all (what every backend's Fit starts with; its own rules
  follow in the exact fit);
* the pod's CPU and memory requests fit the node's free capacity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hami.core.fit import PodOptions
from hami.core.ledger import UsageLedger
from hami.core.model import PERCENT_UNSET, ContainerDeviceRequest, PodRequest
from hami.core.vendor import Vendor

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


Rows = slice | IntArray


def device_mask(ledger: UsageLedger, req: ContainerDeviceRequest, pod: PodOptions,
                rows: Rows | None = None) -> BoolArray:
    """Devices that could host the share request ``req`` on their own (one value per row
    of ``rows``, default every row: length ``ledger.size``); necessary for the exact Fit."""
    return _device_mask(ledger, req, _mutex(pod), allowed_types(ledger, req, pod),
                        slice(0, ledger.size) if rows is None else rows)


def allowed_types(ledger: UsageLedger, req: ContainerDeviceRequest,
                  pod: PodOptions) -> list[int] | None:
    """The ledger's type ids (:attr:`UsageLedger.type_names`) that ``req``'s type and the
    pod's type filters accept; None when every registered type is."""
    allowed = [i for i, t in enumerate(ledger.type_names)
               if req.type.lower() in t.lower() and pod.type_ok(t)]
    return allowed if len(allowed) < len(ledger.type_names) else None


def _mutex(pod: PodOptions) -> bool:
    return "mutex" in pod.gpu_policy.split(",")


def _device_mask(ledger: UsageLedger, req: ContainerDeviceRequest, mutex: bool,
                 allowed: list[int] | None, rows: Rows) -> BoolArray:
    ok = share_mask(ledger, req, rows)
    if mutex:
        ok &= ledger.used_slots[rows] == 0
    if allowed is not None:
        ok &= np.isin(ledger.type_id[rows], allowed)
    return ok


def share_mask(ledger: UsageLedger, req: ContainerDeviceRequest,
               rows: Rows | None = None) -> BoolArray:
    """Devices whose free slots, memory and cores could hold ``req`` (the share rules
    of :func:`hami.core.fit.fit_shares` that do not depend on the pod's filters); one
    value per row of ``rows``, default every row."""
    rows = slice(0, ledger.size) if rows is None else rows
    tot_mem, tot_cores = ledger.total_memory_mib[rows], ledger.total_cores[rows]
    used_slots, used_cores = ledger.used_slots[rows], ledger.used_cores[rows]
    cores = min(req.cores_percent, 100)
    if req.memory_mib > 0:
        memreq: IntArray | int = req.memory_mib
    elif req.memory_percent != PERCENT_UNSET:
        memreq = tot_mem * req.memory_percent // 100
    else:
        memreq = 0
    ok: BoolArray = ledger.healthy[rows] & (used_slots < ledger.split_count[rows])
    ok &= tot_mem - ledger.used_memory_mib[rows] >= memreq
    ok &= tot_cores - used_cores >= cores
    if cores == 100:
        ok &= ~((tot_cores == 100) & (used_slots > 0))
    if cores == 0:
        ok &= ~((tot_cores != 0) & (used_cores == tot_cores))
    return ok


def node_mask(ledger: UsageLedger, request: PodRequest, pod: PodOptions,
              vendors: Mapping[str, Vendor] | None = None) -> BoolArray:
    """Per node index (length ``ledger.node_count``): True when every container's
    request passes its device prefilter and the CPU/memory check does. ``vendors`` (by
    CommonWord) tells which requested vendors follow the share rules
    (``Vendor.share_prefilter``); the others' requests are checked by device count."""
    count = ledger.node_count
    mask: BoolArray = ledger.node_active[:count].copy()
    n = ledger.size
    node_of = ledger.node_of[:n]
    for req in request.containers:
        if req is None or req.nums <= 0:
            continue
        mask &= _share_counts(ledger, req, pod) >= req.nums
    needed: dict[str, int] = {}
    for reqs in request.vendors:
        for word, vreq in reqs.items():
            backend = (vendors or {}).get(word)
            if backend is not None and backend.share_prefilter:
                ok = share_mask(ledger, vreq) & ledger.vendor_rows(word)
                mask &= np.bincount(node_of[ok], minlength=count)[:count] >= vreq.nums
            else:
                needed[word] = max(needed.get(word, 0), vreq.nums)
    for word, nums in needed.items():
        mask &= ledger.vendor_device_counts(word)[:count] >= nums
    mask &= resources_fit(ledger, request, slice(0, count))
    return mask


#: At most this many request shapes keep their counts (a ledger's ``derived`` cache).
COUNT_CACHE_SHAPES = 512


@dataclass(slots=True)
class _Counts:
    """Per node, the devices that could each host one request shape, as of the ledger's
    ``version`` and ``usage_seq``."""

    version: int
    seq: int
    per_node: IntArray
    mutex: bool
    allowed: list[int] | None


def _share_counts(ledger: UsageLedger, req: ContainerDeviceRequest,
                  pod: PodOptions) -> IntArray:
    """Per node index: :func:`device_mask`'s devices counted as :func:`_devices_per_node`
    does. Kept per request shape and recounted only on the nodes whose usage changed since
    (usually one per decision); a node added or removed recounts everything. The result
    is the cache's array: do not modify."""
    cache: dict[tuple[object, ...], _Counts] = ledger.derived.setdefault("prefilter", {})
    mutex = _mutex(pod)
    key = (req.type, req.memory_mib, req.memory_percent, req.cores_percent, mutex,
           pod.use_types, pod.nouse_types)
    hit = cache.get(key)
    count, seq = ledger.node_count, ledger.usage_seq
    if hit is not None and hit.version == ledger.version:
        if hit.seq != seq:
            changed = ledger.changed_nodes(hit.seq)
            hit.seq = seq
            if changed.size * 8 < count:
                rows = ledger.node_rows(changed)
                ok = _device_mask(ledger, req, hit.mutex, hit.allowed, rows)
                if isinstance(rows, slice):  # one node: count its rows directly
                    hit.per_node[changed] = _node_devices(ledger, ok, rows)
                else:
                    hit.per_node[changed] = _devices_per_node(
                        ledger, ok, ledger.node_of[rows], count, rows)[changed]
                return hit.per_node
        else:
            return hit.per_node
    if len(cache) >= COUNT_CACHE_SHAPES:
        cache.clear()
    n = ledger.size
    allowed = allowed_types(ledger, req, pod)
    per_node = _devices_per_node(
        ledger, _device_mask(ledger, req, mutex, allowed, slice(0, n)), ledger.node_of[:n],
        count, slice(0, n))
    cache[key] = _Counts(ledger.version, seq, per_node, mutex, allowed)
    return per_node


def _node_devices(ledger: UsageLedger, ok: BoolArray, rows: slice) -> int:
    """:func:`_devices_per_node` of the one node whose device rows are ``rows``."""
    devices = int(np.count_nonzero(ok))
    if ledger.has_mig_rows():
        mig = ok & ledger.mig_mode[rows]
        devices += int((ledger.split_count[rows][mig] - ledger.used_slots[rows][mig] - 1).sum())
    return devices


def _devices_per_node(ledger: UsageLedger, ok: BoolArray, node_of: IntArray,
                      count: int, rows: Rows) -> IntArray:
    """Per node index: how many devices of ``ok`` (over ``rows``, whose nodes are
    ``node_of``) it could give a container, a MIG-mode GPU counting once per free task
    slot (each instance is a device of its own)."""
    per_node: IntArray = np.bincount(node_of[ok], minlength=count)[:count]
    if ledger.has_mig_rows():  # an unweighted count is several times cheaper
        mig = ok & ledger.mig_mode[rows]
        extra = ledger.split_count[rows][mig] - ledger.used_slots[rows][mig] - 1
        per_node += np.bincount(node_of[mig], weights=extra, minlength=count)[
            :count].astype(np.int64)
    return per_node


def resources_fit(ledger: UsageLedger, request: PodRequest, idx: IntArray | slice) -> BoolArray:
    """Per node of ``idx``: the pod's CPU and memory requests fit (a total of -1 is not
    checked)."""
    cpu_total, mem_total = ledger.cpu_milli_total[idx], ledger.memory_mib_total[idx]
    cpu_ok = (cpu_total < 0) | (ledger.cpu_milli_used[idx] + request.cpu_milli <= cpu_total)
    mem_ok = (mem_total < 0) | (ledger.memory_mib_used[idx] + request.memory_mib <= mem_total)
    result: BoolArray = cpu_ok & mem_ok
    return result
