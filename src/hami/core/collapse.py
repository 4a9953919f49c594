"""Init-container collapse: what a pod really holds on each GPU (HAMi ``initContainer.go``).

Source: HAMi v2.10. Init containers run one after
another, so per GPU a pod needs the *peak* of its init containers or the *sum* of its app
containers, whichever is larger (field case B04).

Divergence from HAMi (HAMi v2.10 quirks 1 and 8): positions are classified with the pod's
real init-container count, never with a list whose GPU-less containers were dropped, so a
GPU-less init container cannot make an app container's usage disappear (field case B06).
"""

from __future__ import annotations

from collections.abc import Iterable

from hami.core.model import ContainerDevices, DeviceCharge, PodSingleDevice


def collapse(containers: Iterable[tuple[bool, ContainerDevices]]) -> tuple[DeviceCharge, ...]:
    """Collapse ``(is_init, devices)`` pairs into one charge per GPU, sorted by UUID.

    Per UUID: init part = max memory, max cores, 1 slot if any init entry; app part = sums
    and one slot per entry; effective = the larger of each, at least one slot.
    """
    init: dict[str, list[int]] = {}
    app: dict[str, list[int]] = {}
    for is_init, devices in containers:
        for dev in devices:
            if not dev.uuid:
                continue
            # HAMi's decoder accepts negative usage; a negative charge would hand out
            # capacity that is not there, so it counts as 0.
            mem, cores = max(dev.used_memory_mib, 0), max(dev.used_cores_percent, 0)
            if is_init:
                agg = init.setdefault(dev.uuid, [0, 0, 1])
                agg[0] = max(agg[0], mem)
                agg[1] = max(agg[1], cores)
            else:
                agg = app.setdefault(dev.uuid, [0, 0, 0])
                agg[0] += mem
                agg[1] += cores
                agg[2] += 1
    charges = []
    for uuid in sorted(init.keys() | app.keys()):
        i, a = init.get(uuid, [0, 0, 0]), app.get(uuid, [0, 0, 0])
        charges.append(DeviceCharge(uuid=uuid, memory_mib=max(i[0], a[0]),
                                    cores_percent=max(i[1], a[1]), slots=max(i[2], a[2], 1)))
    return tuple(charges)


def pod_charges(devices: PodSingleDevice, n_init: int) -> tuple[DeviceCharge, ...]:
    """Collapse a whole pod's grant (init containers are the first ``n_init`` entries)."""
    return collapse((pos < n_init, ctr) for pos, ctr in enumerate(devices))


def app_only_charges(devices: PodSingleDevice, n_init: int) -> tuple[DeviceCharge, ...]:
    """What the pod holds once every init container has finished (HAMi v2.10 shrink)."""
    return collapse((False, ctr) for pos, ctr in enumerate(devices) if pos >= n_init)


def total(charges: Iterable[DeviceCharge]) -> tuple[int, int]:
    """Sum of ``(memory_mib, cores_percent)`` over charges (what quota counts)."""
    mem = cores = 0
    for c in charges:
        mem += c.memory_mib
        cores += c.cores_percent
    return mem, cores
