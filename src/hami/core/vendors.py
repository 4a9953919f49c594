"""One pod, every registered vendor: requests, admission, annotations (HAMi v2.10
``Resourcereqs``, ``MutateAdmission`` per vendor, ``PatchAnnotations``).

Vendor-neutral: every backend is reached through :class:`hami.core.vendor.Vendor`.

* Containers are init containers first, then regular ones; each has a request per vendor.
* Within a container, vendors are visited in CommonWord order (Go map order is random;
  any deterministic order is allowed).
* The allocation is one :data:`PodSingleDevice` per vendor with one entry per container
  (``()`` for containers without that vendor's devices): the padding is on the vendor
  key (the pre-``9e75c87f`` behaviour of HAMi v2.10, chosen deliberately: it keeps each
  vendor's string positional, so the device plugin maps entries to the right containers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hami.core.model import ContainerDeviceRequest, ContainerDevices, PodSingleDevice
from hami.core.podobjects import sidecar_positions
from hami.core.vendor import PatchContext, Vendor


@dataclass(frozen=True, slots=True)
class PodDeviceRequests:
    """Per container (init first) the request of each vendor it asks for."""

    containers: tuple[Mapping[str, ContainerDeviceRequest], ...]
    n_init: int = 0
    #: Positions of the sidecars (restartable init containers) among the init containers.
    sidecars: frozenset[int] = frozenset()

    @property
    def vendors(self) -> tuple[str, ...]:
        """CommonWords requested by any container, sorted."""
        return tuple(sorted({w for c in self.containers for w in c}))


def pod_containers(pod: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
    """``(init containers, regular containers)`` of a pod (JSON mapping); ``[]`` when absent."""
    spec = pod.get("spec") or {}
    return list(spec.get("initContainers") or []), list(spec.get("containers") or [])


def pod_requests(registry: Mapping[str, Vendor], pod: Mapping[str, Any]) -> PodDeviceRequests:
    """Every container's requests of every vendor of ``registry`` (``Resourcereqs``).

    Raises:
        hami.core.vendor.AdmissionError: a vendor value is malformed.
    """
    anns = (pod.get("metadata") or {}).get("annotations") or {}
    init, app = pod_containers(pod)
    out = []
    for container in [*init, *app]:
        reqs: dict[str, ContainerDeviceRequest] = {}
        for word, vendor in sorted(registry.items()):
            req = vendor.request_for_pod(container, anns)
            if req is not None and req.nums > 0:
                reqs[word] = req
        out.append(reqs)
    return PodDeviceRequests(tuple(out), len(init), sidecar_positions(pod))


def mutate_pod(registry: Mapping[str, Vendor], pod: dict[str, Any]) -> bool:
    """HAMi v2.10 step 4: every vendor's ``MutateAdmission`` on every init then regular
    container, in place; returns ``hasResource`` (OR of all results).

    Raises:
        hami.core.vendor.AdmissionError: from the first vendor that refuses a value.
    """
    init, app = pod_containers(pod)
    has = False
    for container in [*init, *app]:
        for _, vendor in sorted(registry.items()):
            has = vendor.mutate_admission(container, pod) or has
    return has


def pod_patch(registry: Mapping[str, Vendor], allocation: Mapping[str, PodSingleDevice],
              ctx: PatchContext) -> dict[str, str]:
    """The pod annotations of every vendor's ``PatchAnnotations`` (HAMi v2.10 step 8), merged.

    Raises:
        ValueError: two vendors write different values under one key (a config error:
            two vendors configured with the same keys).
    """
    out: dict[str, str] = {}
    for word in sorted(allocation):
        for key, value in registry[word].pod_annotations(allocation[word], ctx).items():
            if key in out and out[key] != value:
                raise ValueError(f"vendors disagree on pod annotation {key}")
            out[key] = value
    return out


def merge_allocation(allocation: Mapping[str, PodSingleDevice], n_containers: int
                     ) -> PodSingleDevice:
    """All vendors' grants as one :data:`PodSingleDevice` (container by container, vendors
    in CommonWord order). UUIDs are unique across vendors, so the usage ledger can charge
    this merged value exactly as it charges an NVIDIA-only pod (HAMi v2.10)."""
    merged: list[ContainerDevices] = [() for _ in range(n_containers)]
    for word in sorted(allocation):
        for pos, container in enumerate(allocation[word]):
            merged[pos] = merged[pos] + tuple(container)
    return tuple(merged)
