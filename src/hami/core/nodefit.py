"""The exact fit of one pod on one node, every vendor in one container loop (HAMi v2.10
``Fit`` per container, steps 1-2 of the filter).

Per container (ordinary init containers on fresh copies of the node's usage plus the
sidecars placed before them; sidecars, i.e. restartable init containers, and app
containers cumulatively on one copy, as Kubernetes adds a sidecar's request to the later
init containers and to the app containers, KEP-753): the GPU-share request (``PodRequest.containers``: the core's
Fit, MIG and topology included) first, then every other requested vendor's in CommonWord
order through its backend (``Vendor.fit`` on that vendor's devices only, ``add_usage``,
the vendor's fit-time quota check). The node score adds each granted vendor's
``ScoreNode`` (policy-neutral vendors x10000, x-10000 under spread).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from hami.core.codec import MigAllocation, ScoringWeights
from hami.core.collapse import INIT, SIDECAR, Role, collapse, role_of, total
from hami.core.fit import (
    DEVICE_TYPE_NOT_FOUND,
    NODE_INSUFFICIENT_DEVICE,
    DeviceState,
    FitOutcome,
    NodeOptions,
    PodOptions,
    QuotaCheck,
    fit_shares,
    of_type,
)
from hami.core.ledger import NodeEntry, UsageLedger
from hami.core.model import (
    ContainerDevice,
    ContainerDeviceRequest,
    ContainerDevices,
    PodRequest,
    PodSingleDevice,
)
from hami.core.quota import QuotaLedger
from hami.core.score import order_devices
from hami.core.vendor import FitContext, Vendor
from hami.core.vendor_quota import VendorQuota

INSUFFICIENT_CPU = "Insufficient cpu"
INSUFFICIENT_MEMORY = "Insufficient memory"
#: ``OverrideScore`` weight of a policy-neutral vendor's ScoreNode (HAMi v2.10 step 5).
POLICY_NEUTRAL_WEIGHT = 10000.0

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class FilterContext:
    """What the policies need to rank candidates for one pod.

    ``vendors`` are the registered backends other than the GPU-share path, by CommonWord,
    and ``vendor_quota`` their namespace quota (HAMi v2.10); both only matter for pods
    that ask for them. ``node_policy`` is the effective node policy (for policy-neutral
    ScoreNode signs).
    """

    ledger: UsageLedger
    request: PodRequest
    pod: PodOptions
    weights: ScoringWeights
    vendors: Mapping[str, Vendor] = field(default_factory=dict)
    vendor_quota: VendorQuota | None = None
    node_policy: str = "binpack"


class BestFirst:
    """Candidate node indices best first, sorted only if the caller goes past the best.

    Iterating yields ``first``, then the indices of ``full()`` (the complete order, which
    starts with ``first``) except ``first``: the filter usually stops at the first node
    that fits, so the sort of every candidate is mostly never made.
    """

    __slots__ = ("first", "_full")

    def __init__(self, first: int, full: Callable[[], IntArray]) -> None:
        self.first = first
        self._full = full

    def __iter__(self) -> Iterator[int]:
        yield self.first
        skipped = False
        for i in self._full().tolist():
            if i == self.first and not skipped:
                skipped = True
                continue
            yield i


#: Node policies: candidate node indices (input order) -> the same indices best first,
#: as an array or a :class:`BestFirst`.
NodeOrder = Callable[[FilterContext, IntArray], "IntArray | BestFirst"]


@dataclass(frozen=True, slots=True)
class NodeFit:
    """Exact fit of a whole pod on one node: the grant, or the reason it does not fit.

    ``vendor_devices``: the other vendors' grants; ``score_extra``: the sum of their
    ``ScoreNode`` values (already weighted for policy-neutral vendors, step 5).
    """

    devices: PodSingleDevice | None
    reason: str = ""
    mig: tuple[MigAllocation, ...] = ()
    vendor_devices: Mapping[str, PodSingleDevice] = field(default_factory=dict)
    score_extra: float = 0.0


def _quota_check(quota: QuotaLedger | None, request: PodRequest,
                 placed: list[tuple[Role, ContainerDevices]], role: Role) -> QuotaCheck | None:
    if quota is None or not quota.limited(request.namespace):
        return None

    def check(devices: Sequence[ContainerDevice]) -> bool:
        mem, cores = total(collapse([*placed, (role, tuple(devices))]))
        return quota.fits(request.namespace, mem, cores)

    return check


class _PodFit:
    """The working state of one pod's fit on one node (the grants so far)."""

    def __init__(self, ctx: FilterContext, entry: NodeEntry, quota: QuotaLedger | None):
        self.ctx, self.entry, self.quota = ctx, entry, quota
        ledger, request = ctx.ledger, ctx.request
        self.base = ledger.device_usage(entry.name)
        self.occupied = ledger.mig_occupied(entry.name)
        self.node = NodeOptions.from_annotations(entry.annotations,
                                                 request.share_filters.node_scores)
        n = len(request.containers)
        self.grant: list[ContainerDevices] = [() for _ in range(n)]
        self.vgrant: dict[str, list[ContainerDevices]] = {w: [() for _ in range(n)]
                                                          for w in request.vendor_words}
        self.placed: list[tuple[Role, ContainerDevices]] = []
        self.mig: list[MigAllocation] = []
        self.app_state = self.fresh()
        #: A sidecar was placed: ``app_state`` holds more than the node's usage.
        self.sidecar_placed = False

    def fresh(self) -> list[DeviceState]:
        """The node's devices with their pre-existing usage (and this pod's MIG holds)."""
        occupied = self.occupied
        return [DeviceState(*b, mig_occupied=list(occupied.get(b[0].uuid, ())))
                for b in self.base]

    def init_state(self) -> list[DeviceState]:
        """What an ordinary init container is fitted on: a fresh copy of the node's usage
        with the sidecars placed so far (they run beside it; KEP-753). Before any app
        container is placed ``app_state`` is exactly that, so it is copied."""
        if not self.sidecar_placed:
            return self.fresh()
        return [replace(d, mig_occupied=list(d.mig_occupied)) for d in self.app_state]

    def state_for(self, role: Role) -> list[DeviceState]:
        """The device states a container of ``role`` is fitted on (and, but for an
        ordinary init container, charged to)."""
        if role == INIT:
            return self.init_state()
        if role == SIDECAR:
            self.sidecar_placed = True
        return self.app_state

    def share(self, pos: int, req: ContainerDeviceRequest, state: list[DeviceState],
              role: Role) -> str:
        """Fit container ``pos``'s GPU-share request; "" or the reason it does not fit."""
        ctx = self.ctx
        is_init = role == INIT
        quota_ok = _quota_check(self.quota, ctx.request, self.placed, role)
        ordered = order_devices(state, req, ctx.pod, ctx.weights)
        outcome = fit_shares(of_type(ordered, req.type), req, ctx.pod, self.node, quota_ok)
        if not outcome.ok:
            return outcome.reason
        if not is_init:
            _charge(state, outcome)
        self.grant[pos] = outcome.devices
        for device_index, profile, placement in outcome.mig:
            self.mig.append(MigAllocation(pos, device_index,
                                          outcome.devices[device_index].uuid, profile,
                                          placement))
        self._hold_pod_mig(outcome, is_init)
        self.placed.append((role, outcome.devices))
        return ""

    def _hold_pod_mig(self, outcome: FitOutcome, is_init: bool) -> None:
        """Keep a container's MIG instances out of the pod's other containers' way.

        Init containers are fitted on fresh copies of the node (their usage is not
        summed, HAMi v2.10), but the device plugin creates every instance of the pod at
        Allocate, so all of a pod's placements must be disjoint: later fresh copies
        (``occupied``) and the app containers' state see them. App containers' own
        placements are already in ``app_state`` (:func:`_charge`).
        """
        for device_index, _, placement in outcome.mig:
            uuid = outcome.devices[device_index].uuid
            self.occupied.setdefault(uuid, []).append(placement)
            if is_init:
                for d in self.app_state:
                    if d.info.uuid == uuid:
                        d.mig_occupied.append(placement)

    def vendor(self, pos: int, word: str, vreq: ContainerDeviceRequest,
               state: list[DeviceState]) -> str:
        """Fit container ``pos``'s request of vendor ``word``; "" or the reason."""
        ctx, request, entry = self.ctx, self.ctx.request, self.entry
        backend = ctx.vendors.get(word)
        if backend is None:
            return DEVICE_TYPE_NOT_FOUND
        mine = [d for d in state if d.info.vendor == word]
        if vreq.nums > len(mine):
            return NODE_INSUFFICIENT_DEVICE
        earlier = tuple(self.vgrant[word][:pos])
        check = (ctx.vendor_quota.fit_check(request.namespace, word, earlier,
                                            request.n_init, pos, request.sidecars)
                 if ctx.vendor_quota is not None else None)
        fit_ctx = FitContext(request.annotations, entry.annotations, entry.name,
                             ctx.pod.gpu_policy, allocated=earlier, quota_ok=check)
        options = PodOptions(gpu_policy=ctx.pod.gpu_policy)
        outcome = backend.fit(order_devices(mine, vreq, options, ctx.weights), vreq, fit_ctx)
        if not outcome.ok:
            return outcome.reason
        by_uuid = {d.info.uuid: d for d in mine}
        for dev in outcome.devices:
            target = by_uuid.get(dev.uuid)
            if target is None:
                return f'Device with UUID "{dev.uuid}" not found on node {entry.name} after Fit'
            backend.add_usage(target, dev)
        self.vgrant[word][pos] = outcome.devices
        return ""

    def vendor_scores(self, allocation: Mapping[str, PodSingleDevice]) -> float:
        """Σ ``ScoreNode`` of the granted vendors over the node's pre-existing usage (HAMi
        v2.10 step 5); policy-neutral vendors weigh x10000, x-10000 under spread."""
        ctx, entry = self.ctx, self.entry
        scoring = [w for w in allocation if ctx.vendors[w].scores_nodes]
        if not scoring:
            return 0.0  # every ScoreNode is the default 0
        extra = 0.0
        base = self.fresh()
        fit_ctx = FitContext(ctx.request.annotations, entry.annotations, entry.name,
                             ctx.pod.gpu_policy)
        for word in scoring:
            backend = ctx.vendors[word]
            value = backend.score_node([d for d in base if d.info.vendor == word],
                                       allocation[word], fit_ctx)
            if backend.policy_neutral:
                value *= (-POLICY_NEUTRAL_WEIGHT if ctx.node_policy == "spread"
                          else POLICY_NEUTRAL_WEIGHT)
            extra += value
        return extra


def _charge(state: list[DeviceState], outcome: FitOutcome) -> None:
    """Add an app container's GPU-share grant (and its MIG instances) to ``state``."""
    by_uuid = {d.info.uuid: d for d in state}
    for dev in outcome.devices:
        d = by_uuid[dev.uuid]
        d.used_slots += 1
        d.used_memory_mib += dev.used_memory_mib
        d.used_cores += dev.used_cores_percent
    for device_index, _, placement in outcome.mig:
        by_uuid[outcome.devices[device_index].uuid].mig_occupied.append(placement)


def fit_node(ctx: FilterContext, entry: NodeEntry, quota: QuotaLedger | None = None) -> NodeFit:
    """Exact HAMi fit of every container of the pod on one node (HAMi v2.10 steps 1-2).

    ``quota`` is the GPU-share namespace quota (``ctx.vendor_quota`` the other vendors').
    """
    ledger, request = ctx.ledger, ctx.request
    i = entry.index
    cpu_total, memory_total = int(ledger.cpu_milli_total[i]), int(ledger.memory_mib_total[i])
    if cpu_total >= 0 and int(ledger.cpu_milli_used[i]) + request.cpu_milli > cpu_total:
        return NodeFit(None, INSUFFICIENT_CPU)
    if memory_total >= 0 and (int(ledger.memory_mib_used[i]) + request.memory_mib
                              > memory_total):
        return NodeFit(None, INSUFFICIENT_MEMORY)
    pod = _PodFit(ctx, entry, quota)
    for pos, req in enumerate(request.containers):
        vreqs = request.vendors[pos] if pos < len(request.vendors) else {}
        wants_share = req is not None and req.nums > 0
        if not wants_share and not vreqs:
            continue
        role = role_of(pos, request.n_init, request.sidecars)
        state = pod.state_for(role)
        if req is not None and wants_share and (reason := pod.share(pos, req, state, role)):
            return NodeFit(None, reason)
        for word in sorted(vreqs):
            if reason := pod.vendor(pos, word, vreqs[word], state):
                return NodeFit(None, reason)
    vendor_devices = {w: tuple(g) for w, g in pod.vgrant.items()}
    return NodeFit(tuple(pod.grant), mig=tuple(pod.mig), vendor_devices=vendor_devices,
                   score_extra=pod.vendor_scores(vendor_devices))


def scores_nodes(vendors: Mapping[str, Vendor], words: Sequence[str]) -> bool:
    """True when a requested vendor's ``ScoreNode`` can be non-zero (it overrides the
    default 0, or it is policy-neutral), so the first fitting node is not enough."""
    return any(vendor.scores_nodes for word in words
               if (vendor := vendors.get(word)) is not None)
