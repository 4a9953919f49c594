"""Namespace quota for every vendor (HAMi ``pkg/device/quota.go``, HAMi v2.10).

Usage and limits are tracked per namespace per *resource name*; only the memory and core
names of registered vendors are tracked. ``limits.<name>`` of a ResourceQuota's
``spec.hard`` sets a limit (integers only; an explicit 0 blocks); a vendor's memory limit
is multiplied by its ``memoryFactor``. Several ResourceQuotas of one namespace all apply:
per resource the tightest limit counts, and deleting one leaves the others in force (HAMi
lets the last one written win; see ``docs/decisions.md``). The NVIDIA-only :class:`hami.core.quota.QuotaLedger`
stays the core's for NVIDIA; :class:`hami.core.state.ClusterState` keeps this ledger for
the registry's other vendors (webhook pre-check, fit-time check, usage of placed pods).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami.core.collapse import collapse, effective_request, pod_charges, role_of, total
from hami.core.fit import QuotaCheck
from hami.core.model import ContainerDevice, ContainerDevices, PodSingleDevice
from hami.core.quantity import QuantityError, parse_quantity, to_int_exact
from hami.core.vendor import Vendor
from hami.core.vendors import PodDeviceRequests


@dataclass(slots=True)
class _Entry:
    limit: int | None = None
    used: int = 0


@dataclass(slots=True)
class VendorQuota:
    """Per namespace, per resource name: limit (None = unset) and usage."""

    registry: Mapping[str, Vendor]
    _data: dict[str, dict[str, _Entry]] = field(default_factory=dict)
    _sources: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)

    def _tracked(self) -> set[str]:
        names: set[str] = set()
        for vendor in self.registry.values():
            rn = vendor.resource_names()
            names.update(n for n in (rn.memory, rn.cores) if n)
        return names

    def _entry(self, namespace: str, name: str) -> _Entry:
        return self._data.setdefault(namespace, {}).setdefault(name, _Entry())

    def set_quota(self, namespace: str, quota_name: str, hard: Mapping[str, Any]) -> None:
        """Add or update the ResourceQuota ``quota_name`` (its earlier limits are replaced;
        other quota objects of the namespace are untouched). Per resource the namespace's
        effective limit is the smallest over all its quota objects that set it."""
        limits: dict[str, int] = {}
        for name in self._tracked():
            key = "limits." + name
            if key not in hard:
                continue
            try:
                value = to_int_exact(parse_quantity(hard[key]))
            except QuantityError:
                continue
            if value is not None:
                limits[name] = value
        old = self._sources.get((namespace, quota_name), {})
        self._sources[(namespace, quota_name)] = limits
        self._recompute(namespace, set(old) | set(limits))

    def remove_quota(self, namespace: str, quota_name: str) -> None:
        """Forget a ResourceQuota: the namespace's other quota objects still apply (a
        resource none of them sets becomes unlimited); usage stays."""
        old = self._sources.pop((namespace, quota_name), None)
        if old:
            self._recompute(namespace, set(old))

    def _recompute(self, namespace: str, names: set[str]) -> None:
        """Effective limit of each of ``names`` in ``namespace``: the tightest set by any
        of the namespace's quota objects, None when none sets it."""
        for name in names:
            values = [limits[name] for (ns, _), limits in self._sources.items()
                      if ns == namespace and name in limits]
            self._entry(namespace, name).limit = min(values) if values else None

    def limit(self, namespace: str, name: str) -> int | None:
        """The effective limit of ``name``: the tightest of the namespace's quota objects
        (None = unset; memoryFactor not applied)."""
        entry = self._data.get(namespace, {}).get(name)
        return None if entry is None else entry.limit

    def limited(self) -> list[tuple[str, str, int, int]]:
        """``(namespace, resource name, limit, used)`` for every resource with a limit set,
        sorted (what the quota metrics report, HAMi v2.10)."""
        return sorted((ns, name, e.limit, e.used) for ns, entries in self._data.items()
                      for name, e in entries.items() if e.limit is not None)

    def used(self, namespace: str, name: str) -> int:
        """Usage charged to ``name``."""
        entry = self._data.get(namespace, {}).get(name)
        return 0 if entry is None else entry.used

    def fits(self, namespace: str, vendor: str, memory_mib: int, cores: int) -> bool:
        """``FitQuota``: unknown vendor or namespace fit; memory limit x memoryFactor."""
        v = self.registry.get(vendor)
        if v is None or namespace not in self._data:
            return True
        rn = v.resource_names()
        if rn.memory:
            entry = self._data[namespace].get(rn.memory)
            if entry is not None and entry.limit is not None:
                limit = entry.limit * rn.memory_factor if rn.memory_factor > 1 else entry.limit
                if entry.used + memory_mib > limit:
                    return False
        if rn.cores:
            entry = self._data[namespace].get(rn.cores)
            if entry is not None and entry.limit is not None and entry.used + cores > entry.limit:
                return False
        return True

    def _charge(self, namespace: str, allocation: Mapping[str, PodSingleDevice], n_init: int,
                sign: int, sidecars: Collection[int]) -> None:
        for word, grant in allocation.items():
            v = self.registry.get(word)
            if v is None:
                continue
            rn = v.resource_names()
            mem, cores = total(pod_charges(grant, n_init, sidecars))
            for name, amount in ((rn.memory, mem), (rn.cores, cores)):
                if name:
                    entry = self._entry(namespace, name)
                    entry.used = max(0, entry.used + sign * amount)

    def add_usage(self, namespace: str, allocation: Mapping[str, PodSingleDevice],
                  n_init: int = 0, sidecars: Collection[int] = ()) -> None:
        """Charge a placed pod (its collapsed allocation, HAMi v2.10; ``sidecars``: the
        positions of its restartable init containers, :mod:`hami.core.collapse`)."""
        self._charge(namespace, allocation, n_init, 1, sidecars)

    def remove_usage(self, namespace: str, allocation: Mapping[str, PodSingleDevice],
                     n_init: int = 0, sidecars: Collection[int] = ()) -> None:
        """Release a removed pod; never below zero."""
        self._charge(namespace, allocation, n_init, -1, sidecars)

    def admission_denial(self, namespace: str, requests: PodDeviceRequests) -> str:
        """The webhook pre-check (``fitResourceQuota``): per vendor, app = Σ over regular
        containers of mem x nums (cores x nums), init = max over init containers;
        request = max(app, init), each sidecar added to the app containers and to every
        init container after it (KEP-753, :func:`hami.core.collapse.effective_request`);
        skipped when both are 0. Returns "" or the denial."""
        for word in requests.vendors:
            mem, cores = effective_request(
                (role_of(pos, requests.n_init, requests.sidecars),
                 r.memory_mib * r.nums, r.cores_percent * r.nums)
                for pos, reqs in enumerate(requests.containers)
                if (r := reqs.get(word)) is not None)
            if (mem or cores) and not self.fits(namespace, word, mem, cores):
                return "exceeding resource quota"
        return ""

    def fit_check(self, namespace: str, vendor: str, placed: Sequence[ContainerDevices],
                  n_init: int, position: int,
                  sidecars: Collection[int] = ()) -> QuotaCheck | None:
        """The fit-time check for the container at ``position`` (HAMi v2.10 ``fitQuota``): the
        pod's earlier grants of this vendor plus the candidates, collapsed with the real
        init count and the sidecars' positions. None when the namespace has no limit on
        this vendor."""
        v = self.registry.get(vendor)
        if v is None:
            return None
        rn = v.resource_names()
        if all(self.limit(namespace, n) is None for n in (rn.memory, rn.cores) if n):
            return None
        before = [(role_of(pos, n_init, sidecars), c) for pos, c in enumerate(placed)]
        role = role_of(position, n_init, sidecars)

        def check(candidate: Sequence[ContainerDevice]) -> bool:
            mem, cores = total(collapse([*before, (role, tuple(candidate))]))
            return self.fits(namespace, vendor, mem, cores)

        return check
