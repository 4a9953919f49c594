"""GetPreferredAllocation's answer (HAMi-core 1.2). Pure.

The annotation is authoritative (see :mod:`hami.deviceplugin.allocate`): the answer is one
available replica per annotated GPU, so the kubelet's record agrees with the GPUs the
container gets. Which pod's GPUs are preferred is
:func:`hami.deviceplugin.podchoice.choose_preferred_pod`'s choice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hami.core.model import ContainerDevice
from hami.deviceplugin.podview import (
    AllocateError,
    PodView,
    decode_entries,
    pending_entries,
    physical_uuid,
)


@dataclass(frozen=True, slots=True)
class PreferredRequest:
    """One container of a GetPreferredAllocation call."""

    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


def _annotated_replicas(req: PreferredRequest, entry: Sequence[ContainerDevice] | None,
                        replicas: Mapping[str, str] | None,
                        chosen: list[str], used: set[str]) -> None:
    """Append to ``chosen`` the first available replica of each annotated GPU (the first
    ``req.size``) not in ``used``, until ``chosen`` has ``req.size`` IDs."""
    for d in list(entry or ())[: req.size]:
        if len(chosen) >= req.size:
            break
        if d.uuid in used:
            continue
        for i in req.available:
            if i not in chosen and physical_uuid(i, replicas) == d.uuid:
                chosen.append(i)
                used.add(d.uuid)
                break


def preferred_ids(req: PreferredRequest, entry: Sequence[ContainerDevice] | None,
                  replicas: Mapping[str, str] | None = None) -> list[str]:
    """Kubelet IDs to prefer: must-include first, then for each annotated GPU (the first
    ``size``) the first available replica of it; when short (no annotation, or GPUs not
    available) fill with available IDs on GPUs not yet used, then any available IDs."""
    chosen = list(req.must_include)[: max(req.size, 0)]
    used = {physical_uuid(i, replicas) for i in chosen}
    _annotated_replicas(req, entry, replicas, chosen, used)
    for distinct in (True, False):
        for i in req.available:
            if len(chosen) >= req.size:
                return chosen
            if i in chosen or (distinct and physical_uuid(i, replicas) in used):
                continue
            chosen.append(i)
            used.add(physical_uuid(i, replicas))
    return chosen


def preferred_allocation(pod: PodView | None, requests: Sequence[PreferredRequest],
                         replicas: Mapping[str, str] | None = None) -> list[list[str]]:
    """Answer for every container request: request k follows the pod's k-th non-empty
    entry (kubelet asks container by container, before each Allocate)."""
    entries: list[tuple[ContainerDevice, ...]] = []
    if pod is not None:
        try:
            entries = [c for c in decode_entries(pod) if c]
        except AllocateError:
            entries = []
    return [preferred_ids(r, entries[k] if k < len(entries) else None, replicas)
            for k, r in enumerate(requests)]


def preferred_rank(pod: PodView, requests: Sequence[PreferredRequest],
                   replicas: Mapping[str, str] | None = None) -> int:
    """2 when the pod's next entries have the requested sizes and all their GPUs have an
    available replica; 1 when only sizes match; 0 otherwise."""
    entries = [c for c in decode_entries(pod) if c] if pending_entries(pod) else []
    if len(entries) < len(requests) or not requests:
        return 0
    rank = 2
    for r, entry in zip(requests, entries, strict=False):
        if len(entry) != r.size:
            return 0
        avail = {physical_uuid(i, replicas) for i in r.available + r.must_include}
        if not {d.uuid for d in entry} <= avail:
            rank = 1
    return rank
