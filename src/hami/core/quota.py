"""Namespace quota of the GPU-share path (HAMi ``pkg/device/quota.go``).

Source: HAMi v2.10. Vendor-neutral: the resource names are a backend's
(:meth:`hami.core.vendor.Vendor.resource_names`; the scheduler passes the registered
NVIDIA backend's, whose grants are ``PodRequest.containers``'). A ResourceQuota's
``spec.hard["limits.<memory name>"]`` (e.g. ``limits.nvidia.com/gpumem``: MiB, times
``memory_factor``) and ``["limits.<cores name>"]`` (percent of one card, summed over
cards) cap what the pods of a namespace may hold. An explicit 0 blocks every request (field case B08); only
an absent key means unlimited. A multi-GPU container is charged once per GPU.

Several ResourceQuota objects in one namespace all apply, as in Kubernetes: the effective
limit of a resource is the smallest one any of them sets, and deleting one leaves the
others in force (HAMi lets the last one written win; see ``docs/decisions.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hami.api import names
from hami.core.quantity import QuantityError, parse_quantity, to_int_exact
from hami.core.vendor import ResourceNames

#: HAMi's default NVIDIA names (``nvidia.com/gpumem``, ``nvidia.com/gpucores``).
DEFAULT_RESOURCES = ResourceNames(names.RESOURCE_COUNT, names.RESOURCE_MEMORY,
                                  names.RESOURCE_CORES)


@dataclass(slots=True)
class NamespaceQuota:
    """Limits and usage of one namespace. ``None`` limits are unset (unlimited)."""

    memory_limit_mib: int | None = None
    cores_limit_percent: int | None = None
    memory_used_mib: int = 0
    cores_used_percent: int = 0


class QuotaLedger:
    """GPU memory and core quota per namespace, with usage kept incrementally.

    Limits come from ResourceQuota objects (:meth:`set_quota` / :meth:`remove_quota`),
    usage from placed pods (:meth:`charge` / :meth:`release`). ``resources`` names the
    memory and cores resources and the memory factor (:data:`DEFAULT_RESOURCES` for None).
    """

    def __init__(self, resources: ResourceNames | None = None) -> None:
        self._resources = resources or DEFAULT_RESOURCES
        self._namespaces: dict[str, NamespaceQuota] = {}
        self._sources: dict[tuple[str, str], tuple[int | None, int | None]] = {}

    def _ns(self, namespace: str) -> NamespaceQuota:
        return self._namespaces.setdefault(namespace, NamespaceQuota())

    def set_quota(self, namespace: str, name: str, hard: Mapping[str, Any]) -> None:
        """Apply the ResourceQuota ``name``'s ``spec.hard`` (add, or update: its earlier
        limits are replaced; other quota objects of the namespace are untouched).

        Keys other than ``limits.<memory name>`` and ``limits.<core name>`` are ignored, as
        are values that are not exact integers (HAMi does the same). The namespace's
        effective limit per resource is then the smallest over all its quota objects.
        """
        mem = _limit(hard, "limits." + self._resources.memory)
        cores = _limit(hard, "limits." + self._resources.cores)
        if mem is not None and self._resources.memory_factor > 1:
            mem *= self._resources.memory_factor
        self._sources[(namespace, name)] = (mem, cores)
        self._recompute(namespace)

    def remove_quota(self, namespace: str, name: str) -> None:
        """Forget a deleted ResourceQuota: the namespace's other quota objects still
        apply (a resource none of them sets becomes unlimited); usage stays."""
        if self._sources.pop((namespace, name), None) is not None:
            self._recompute(namespace)

    def _recompute(self, namespace: str) -> None:
        """Effective limits of ``namespace``: per resource the tightest over its quotas."""
        limits = [lim for (ns, _), lim in self._sources.items() if ns == namespace]
        mems = [mem for mem, _ in limits if mem is not None]
        cores = [c for _, c in limits if c is not None]
        ns = self._ns(namespace)
        ns.memory_limit_mib = min(mems) if mems else None
        ns.cores_limit_percent = min(cores) if cores else None

    def sources(self) -> list[tuple[str, str]]:
        """``(namespace, name)`` of every ResourceQuota applied (for a relist to find the
        ones that disappeared)."""
        return sorted(self._sources)

    def quota(self, namespace: str) -> NamespaceQuota:
        """A copy of the namespace's limits and usage."""
        ns = self._namespaces.get(namespace, NamespaceQuota())
        return NamespaceQuota(ns.memory_limit_mib, ns.cores_limit_percent,
                              ns.memory_used_mib, ns.cores_used_percent)

    def limited(self, namespace: str) -> bool:
        """True when the namespace has a memory or core limit set (fast pre-check)."""
        ns = self._namespaces.get(namespace)
        return ns is not None and (ns.memory_limit_mib is not None
                                   or ns.cores_limit_percent is not None)

    def fits(self, namespace: str, memory_mib: int, cores_percent: int) -> bool:
        """True when ``memory_mib`` and ``cores_percent`` more stay within the limits."""
        ns = self._namespaces.get(namespace)
        if ns is None:
            return True
        if ns.memory_limit_mib is not None and ns.memory_used_mib + memory_mib > ns.memory_limit_mib:
            return False
        return not (ns.cores_limit_percent is not None
                    and ns.cores_used_percent + cores_percent > ns.cores_limit_percent)

    def describe(self, namespace: str) -> str:
        """The namespace's limits in words, for a denial: per limited resource the
        ResourceQuota that sets it (the tightest), the limit and the use, e.g.
        ``ResourceQuota team/gpu: limits.nvidia.com/gpumem 8192 MiB (6000 in use)``;
        "" when nothing is limited."""
        ns = self._namespaces.get(namespace, NamespaceQuota())
        parts = []
        for pos, limit, used, key, unit in (
                (0, ns.memory_limit_mib, ns.memory_used_mib,
                 self._resources.memory, " MiB"),
                (1, ns.cores_limit_percent, ns.cores_used_percent,
                 self._resources.cores, "%")):
            if limit is None:
                continue
            owner = min(name for (q_ns, name), lim in self._sources.items()
                        if q_ns == namespace and lim[pos] == limit)
            parts.append(f"ResourceQuota {namespace}/{owner}: limits.{key} {limit}{unit} "
                         f"({used}{unit} in use)")
        return "; ".join(parts)

    def charge(self, namespace: str, memory_mib: int, cores_percent: int) -> None:
        """Add a placed pod's usage."""
        ns = self._ns(namespace)
        ns.memory_used_mib += memory_mib
        ns.cores_used_percent += cores_percent

    def release(self, namespace: str, memory_mib: int, cores_percent: int) -> None:
        """Subtract a removed pod's usage; never below zero."""
        ns = self._ns(namespace)
        ns.memory_used_mib = max(0, ns.memory_used_mib - memory_mib)
        ns.cores_used_percent = max(0, ns.cores_used_percent - cores_percent)

    def namespaces(self) -> dict[str, NamespaceQuota]:
        """Every namespace seen, by name (copies)."""
        return {name: self.quota(name) for name in self._namespaces}


def _limit(hard: Mapping[str, Any], key: str) -> int | None:
    if key not in hard:
        return None
    try:
        return to_int_exact(parse_quantity(hard[key]))
    except QuantityError:
        return None
