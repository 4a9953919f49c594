"""Init-container collapse: what a pod really holds on each GPU (HAMi ``initContainer.go``,
extended with Kubernetes' rule for sidecars).

Source: HAMi v2.10. Ordinary init containers run one after another, so per GPU a pod
needs the *peak* of its init containers or the *sum* of its app containers, whichever is
larger (field case B04).

Sidecars (restartable init containers, ``restartPolicy: Always``; Kubernetes KEP-753,
on by default since 1.29) start in init order and then run for the pod's whole life. As
Kubernetes computes a pod's effective request: a sidecar's usage adds to every init
container that starts after it and to the app containers, so per GPU the charge is
max(each ordinary init container + the sidecars started before it, all sidecars + all
app containers). A pod without sidecars is charged exactly as HAMi charges it.

Divergence from HAMi (HAMi v2.10 quirks 1 and 8): positions are classified with the pod's
real init-container count, never with a list whose GPU-less containers were dropped, so a
GPU-less init container cannot make an app container's usage disappear (field case B06).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Literal

from hami.core.model import ContainerDevices, DeviceCharge, PodSingleDevice

#: A container's part in the collapse: an ordinary init container, a sidecar
#: (restartable init container), or an app (regular) container.
Role = Literal["init", "sidecar", "app"]
INIT: Role = "init"
SIDECAR: Role = "sidecar"
APP: Role = "app"


def role_of(position: int, n_init: int, sidecars: Collection[int] = ()) -> Role:
    """The role of the container at ``position`` (init containers first); ``sidecars``
    are the positions of restartable init containers (all below ``n_init``)."""
    if position >= n_init:
        return APP
    return SIDECAR if position in sidecars else INIT


def collapse(containers: Iterable[tuple[Role, ContainerDevices]]) -> tuple[DeviceCharge, ...]:
    """Collapse ``(role, devices)`` pairs, in container order (init containers first, in
    spec order), into one charge per GPU, sorted by UUID.

    Per UUID, memory, cores and slots separately: running = Σ sidecars seen so far; each
    ordinary init entry is a peak candidate of its own usage + running (1 slot + the
    sidecars' slots); steady = Σ sidecars + Σ app containers (one slot per entry);
    effective = the larger of the peaks and steady, at least one slot. Without sidecars
    this is HAMi's max(max of init, sum of app).
    """
    peak: dict[str, list[int]] = {}
    running: dict[str, list[int]] = {}
    app: dict[str, list[int]] = {}
    for role, devices in containers:
        for dev in devices:
            if not dev.uuid:
                continue
            # HAMi's decoder accepts negative usage; a negative charge would hand out
            # capacity that is not there, so it counts as 0.
            mem, cores = max(dev.used_memory_mib, 0), max(dev.used_cores_percent, 0)
            if role == INIT:
                side = running.get(dev.uuid, (0, 0, 0))
                agg = peak.setdefault(dev.uuid, [0, 0, 0])
                agg[0] = max(agg[0], mem + side[0])
                agg[1] = max(agg[1], cores + side[1])
                agg[2] = max(agg[2], 1 + side[2])
            else:
                agg = (running if role == SIDECAR else app).setdefault(dev.uuid, [0, 0, 0])
                agg[0] += mem
                agg[1] += cores
                agg[2] += 1
    charges = []
    for uuid in sorted(peak.keys() | running.keys() | app.keys()):
        p, s, a = (part.get(uuid, (0, 0, 0)) for part in (peak, running, app))
        charges.append(DeviceCharge(uuid=uuid, memory_mib=max(p[0], s[0] + a[0]),
                                    cores_percent=max(p[1], s[1] + a[1]),
                                    slots=max(p[2], s[2] + a[2], 1)))
    return tuple(charges)


def pod_charges(devices: PodSingleDevice, n_init: int,
                sidecars: Collection[int] = ()) -> tuple[DeviceCharge, ...]:
    """Collapse a whole pod's grant (init containers are the first ``n_init`` entries,
    ``sidecars`` the positions of the restartable ones among them)."""
    return collapse((role_of(pos, n_init, sidecars), ctr) for pos, ctr in enumerate(devices))


def app_only_charges(devices: PodSingleDevice, n_init: int,
                     sidecars: Collection[int] = ()) -> tuple[DeviceCharge, ...]:
    """What the pod holds once every ordinary init container has finished (HAMi v2.10
    shrink): its app containers and its sidecars, which keep running."""
    return collapse((role_of(pos, n_init, sidecars), ctr) for pos, ctr in enumerate(devices)
                    if pos >= n_init or pos in sidecars)


def effective_request(parts: Iterable[tuple[Role, int, int]]) -> tuple[int, int]:
    """A pod's effective ``(memory, cores)`` request from per-container ``(role, memory,
    cores)`` totals in container order: Kubernetes' rule for init containers and sidecars
    (KEP-753), max(each ordinary init + the sidecars before it, Σ sidecars + Σ app), the
    admission quota pre-check's shape (HAMi v2.10 ``fitResourceQuota`` without sidecars)."""
    side_mem = side_cores = app_mem = app_cores = peak_mem = peak_cores = 0
    for role, mem, cores in parts:
        if role == INIT:
            peak_mem = max(peak_mem, mem + side_mem)
            peak_cores = max(peak_cores, cores + side_cores)
        elif role == SIDECAR:
            side_mem, side_cores = side_mem + mem, side_cores + cores
        else:
            app_mem, app_cores = app_mem + mem, app_cores + cores
    return max(peak_mem, side_mem + app_mem), max(peak_cores, side_cores + app_cores)


def phase_request(containers: Iterable[tuple[Role, Collection[str]]],
                  bookings: Mapping[str, tuple[int, int]],
                  always: Collection[str] = ()) -> tuple[int, int]:
    """:func:`effective_request` for containers that hold named, possibly shared,
    objects (DRA mode: a pod's ResourceClaims, each booking ``(memory MiB, cores %)``
    once however many containers use it).

    ``containers``: ``(role, names of the objects it uses)`` in container order (init
    containers first); ``bookings``: what each object books (a name missing from it books
    nothing); ``always``: objects held in every phase (used by no container). The pod's
    phases are Kubernetes' (KEP-753): each ordinary init container with the sidecars
    started before it, and the steady state (every sidecar and app container); a phase
    books the objects its containers use, each once, plus ``always``. Returns the largest
    phase's memory and the largest phase's cores (separately, as :func:`effective_request`).
    When no object is shared between containers this equals :func:`effective_request` of
    the per-container sums."""
    def booked(objs: set[str]) -> tuple[int, int]:
        mem = cores = 0
        for name in objs:
            m, c = bookings.get(name, (0, 0))
            mem, cores = mem + max(m, 0), cores + max(c, 0)
        return mem, cores

    base = set(always)
    sidecars: set[str] = set()
    steady: set[str] = set()
    peak_mem = peak_cores = 0
    for role, objs in containers:
        if role == INIT:
            m, c = booked(base | sidecars | set(objs))
            peak_mem, peak_cores = max(peak_mem, m), max(peak_cores, c)
        elif role == SIDECAR:
            sidecars |= set(objs)
        else:
            steady |= set(objs)
    m, c = booked(base | sidecars | steady)
    return max(peak_mem, m), max(peak_cores, c)


def total(charges: Iterable[DeviceCharge]) -> tuple[int, int]:
    """Sum of ``(memory_mib, cores_percent)`` over charges (what quota counts)."""
    mem = cores = 0
    for c in charges:
        mem += c.memory_mib
        cores += c.cores_percent
    return mem, cores
