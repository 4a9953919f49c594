"""The filter decision: which node and which GPUs for one pod (HAMi ``Scheduler.Filter``).

Source (HAMi v2.10): (flow), (calcScore: init
containers on fresh copies, app containers cumulative, node score = pre-existing usage),
(node ordering). The live extender, ``hami schedule`` and the simulator all call
:func:`filter_pod`.

How it stays fast: the node score does not depend on the pod being placed (HAMi v2.10
quirk 3, kept), so instead of fitting every node and sorting, we (1) drop in one
vectorised pass every node that cannot host some container even alone (a necessary
condition of the exact check), (2) order the remaining nodes by the node policy, and
(3) run the exact HAMi ``Fit`` on them in that order, stopping at the first that fits.
The answer is the one HAMi would choose; exact reasons for every node are computed only
when no node fits (that is when ``FailedNodes`` is reported).

Other vendors (HAMi v2.10): a pod whose containers also ask for registered
non-NVIDIA vendors (``PodRequest.vendors``) takes the same loop; the prefilter then only
covers its NVIDIA containers, and :func:`fit_node` fits each container's NVIDIA request
with the core's Fit and then each other vendor's request, in CommonWord order, through the
vendor's backend (``Vendor.fit`` on that vendor's devices of the node, ``add_usage``,
the vendor's fit-time quota check). The node score adds each vendor's ``ScoreNode``
(policy-neutral vendors x10000, x-10000 under spread); when a requested vendor scores
nodes, every candidate is fitted and the best adjusted score wins. NVIDIA-only pods never
enter that code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from hami.api import names
from hami.core.codec import (
    CodecError,
    MigAllocation,
    ScoringWeights,
    decode_node_scores,
    parse_scoring_weights,
)
from hami.core.collapse import collapse, total
from hami.core.config import SchedulingPolicy, effective_policies
from hami.core.fit import (
    DEVICE_TYPE_NOT_FOUND,
    NODE_INSUFFICIENT_DEVICE,
    DeviceState,
    FitOutcome,
    NodeOptions,
    PodOptions,
    QuotaCheck,
    fit_container,
)
from hami.core.fragmentation import LiveFragmentationOrder
from hami.core.ledger import NodeEntry, UsageLedger
from hami.core.model import (
    PERCENT_UNSET,
    ContainerDevice,
    ContainerDeviceRequest,
    ContainerDevices,
    MigPlacement,
    PodRequest,
    PodSingleDevice,
)
from hami.core.quota import QuotaLedger
from hami.core.score import order_devices
from hami.core.vendor import FitContext, Vendor
from hami.core.vendor_quota import VendorQuota

NODE_UNREGISTERED = "node unregistered"
INSUFFICIENT_CPU = "Insufficient cpu"
INSUFFICIENT_MEMORY = "Insufficient memory"
#: ``OverrideScore`` weight of a policy-neutral vendor's ScoreNode (HAMi v2.10 step 5).
POLICY_NEUTRAL_WEIGHT = 10000.0

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


class FilterError(ValueError):
    """The pod itself is unusable for filtering (e.g. a malformed weights annotation)."""


@dataclass(frozen=True, slots=True)
class FilterResult:
    """Outcome of one filter.

    ``passthrough`` is True for a pod that asks for no device (every node passes, nothing
    is written). Otherwise ``node`` is the chosen node (None when nothing fits), ``devices``
    the NVIDIA grant per container (init first; every entry ``()`` for a pod without
    NVIDIA requests), ``vendor_devices`` the other vendors' grants by CommonWord (one
    entry per container, ``()`` for containers without that vendor: the padding is on
    the vendor key, docs/dev/vendors-design.md) and ``failed_nodes`` the reason per node
    that was found unfit (filled completely only when nothing fits, as HAMi does).
    ``policy_warnings`` has one message per policy annotation whose unknown value was
    ignored for the configured policy (:func:`hami.core.config.effective_policies`); the
    shells report them (an Event, ``hami schedule``'s ``warnings``).
    """

    node: str | None
    devices: PodSingleDevice = ()
    failed_nodes: dict[str, str] = field(default_factory=dict)
    passthrough: bool = False
    score: float = 0.0
    mig: tuple[MigAllocation, ...] = ()
    vendor_devices: Mapping[str, PodSingleDevice] = field(default_factory=dict)
    policy_warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class FilterContext:
    """What the policies need to rank candidates for one pod.

    ``vendors`` are the registered non-NVIDIA backends by CommonWord and ``vendor_quota``
    their namespace quota (HAMi v2.10); both only matter for pods that ask for them.
    ``node_policy`` is the effective node policy (for policy-neutral ScoreNode signs).
    """

    ledger: UsageLedger
    request: PodRequest
    pod: PodOptions
    weights: ScoringWeights
    vendors: Mapping[str, Vendor] = field(default_factory=dict)
    vendor_quota: VendorQuota | None = None
    node_policy: str = "binpack"


#: Node policies: candidate node indices (input order) -> the same indices best first.
NodeOrder = Callable[[FilterContext, IntArray], IntArray]


def _binpack_nodes(ctx: FilterContext, idx: IntArray) -> IntArray:
    scores = ctx.ledger.node_scores()[idx]
    return idx[np.argsort(-scores, kind="stable")]


def _spread_nodes(ctx: FilterContext, idx: IntArray) -> IntArray:
    scores = ctx.ledger.node_scores()[idx]
    return idx[np.argsort(scores, kind="stable")]


#: Node policies (HAMi v2.10): binpack takes the most used node, spread the least used;
#: ties keep the caller's node order. ``fragmentation-aware`` (ours, after FGD, USENIX
#: ATC'23) takes the node where the expected fragmentation of the running workload's task
#: mix grows least; the mix is learned from the pods the ledger holds.
NODE_ORDERS: dict[str, NodeOrder] = {
    "binpack": _binpack_nodes,
    "spread": _spread_nodes,
    "fragmentation-aware": LiveFragmentationOrder(),
}


def _weights(request: PodRequest) -> ScoringWeights:
    raw = request.annotations.get(names.DEVICE_SCORING_WEIGHTS)
    if raw is None:
        return ScoringWeights()
    try:
        return parse_scoring_weights(raw)
    except CodecError as exc:
        raise FilterError(f"pod {request.namespace}/{request.name}: {exc}") from None


# ------------------------------------------------------------------ prefilter
def _device_mask(ledger: UsageLedger, req: ContainerDeviceRequest, pod: PodOptions) -> BoolArray:
    """Devices that could host ``req`` on their own (necessary for the exact Fit)."""
    n = ledger.size
    tot_mem, tot_cores = ledger.total_memory_mib[:n], ledger.total_cores[:n]
    used_slots, used_cores = ledger.used_slots[:n], ledger.used_cores[:n]
    cores = min(req.cores_percent, 100)
    if req.memory_mib > 0:
        memreq: IntArray | int = req.memory_mib
    elif req.memory_percent != PERCENT_UNSET:
        memreq = tot_mem * req.memory_percent // 100
    else:
        memreq = 0
    ok: BoolArray = ledger.healthy[:n] & (used_slots < ledger.split_count[:n])
    ok &= tot_mem - ledger.used_memory_mib[:n] >= memreq
    ok &= tot_cores - used_cores >= cores
    if cores == 100:
        ok &= ~((tot_cores == 100) & (used_slots > 0))
    if cores == 0:
        ok &= ~((tot_cores != 0) & (used_cores == tot_cores))
    if "mutex" in pod.gpu_policy.split(","):
        ok &= used_slots == 0
    allowed = [i for i, t in enumerate(ledger.type_names)
               if req.type.lower() in t.lower() and pod.type_ok(t)]
    if len(allowed) < len(ledger.type_names):
        ok &= np.isin(ledger.type_id[:n], allowed)
    return ok


def _node_mask(ledger: UsageLedger, request: PodRequest, pod: PodOptions) -> BoolArray:
    """Nodes that pass every container's device prefilter and the CPU/memory check."""
    count = ledger.node_count
    mask: BoolArray = ledger.node_active[:count].copy()
    n = ledger.size
    node_of = ledger.node_of[:n]
    for req in request.containers:
        if req is None or req.nums <= 0:
            continue
        ok = _device_mask(ledger, req, pod)
        weight = np.where(ledger.mig_mode[:n], ledger.split_count[:n] - ledger.used_slots[:n], 1)
        per_node = np.bincount(node_of[ok], weights=weight[ok], minlength=count)[:count]
        mask &= per_node >= req.nums
    mask &= _resources_fit(ledger, request, slice(0, count))
    return mask


def _resources_fit(ledger: UsageLedger, request: PodRequest,
                   idx: IntArray | slice) -> BoolArray:
    cpu_total, mem_total = ledger.cpu_milli_total[idx], ledger.memory_mib_total[idx]
    cpu_ok = (cpu_total < 0) | (ledger.cpu_milli_used[idx] + request.cpu_milli <= cpu_total)
    mem_ok = (mem_total < 0) | (ledger.memory_mib_used[idx] + request.memory_mib <= mem_total)
    result: BoolArray = cpu_ok & mem_ok
    return result


# ------------------------------------------------------------------ exact fit
def _node_options(entry: NodeEntry) -> NodeOptions:
    cordon = entry.annotations.get(names.NODE_DEVICE_CORDON, "")
    cordoned = frozenset(p.strip() for p in cordon.split(",") if p.strip())
    scores: dict[str, dict[str, int]] = {}
    raw = entry.annotations.get(names.NODE_SCORE)
    if raw:
        try:
            scores = decode_node_scores(raw)
        except CodecError:
            scores = {}
    return NodeOptions(cordoned=cordoned, pair_scores=scores)


def _quota_check(quota: QuotaLedger | None, request: PodRequest,
                 placed: list[tuple[bool, ContainerDevices]], is_init: bool) -> QuotaCheck | None:
    if quota is None or not quota.limited(request.namespace):
        return None

    def check(devices: Sequence[ContainerDevice]) -> bool:
        mem, cores = total(collapse([*placed, (is_init, tuple(devices))]))
        return quota.fits(request.namespace, mem, cores)

    return check


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


def fit_node(ctx: FilterContext, entry: NodeEntry, quota: QuotaLedger | None = None) -> NodeFit:
    """Exact HAMi fit of every container of the pod on one node (HAMi v2.10 steps 1-2)."""
    ledger, request = ctx.ledger, ctx.request
    i = entry.index
    if not bool(_resources_fit(ledger, request, np.array([i]))[0]):
        cpu_short = (ledger.cpu_milli_total[i] >= 0 and
                     ledger.cpu_milli_used[i] + request.cpu_milli > ledger.cpu_milli_total[i])
        return NodeFit(None, INSUFFICIENT_CPU if cpu_short else INSUFFICIENT_MEMORY)
    base = ledger.device_usage(entry.name)
    occupied = ledger.mig_occupied(entry.name)
    mig: list[MigAllocation] = []
    node = _node_options(entry)
    grant: list[ContainerDevices] = [() for _ in request.containers]
    placed: list[tuple[bool, ContainerDevices]] = []
    def fresh() -> list[DeviceState]:
        return [DeviceState(*b, mig_occupied=list(occupied.get(b[0].uuid, ()))) for b in base]

    app_state = fresh()
    if request.vendors:
        return _fit_node_vendors(ctx, entry, quota, fresh, app_state, node, occupied)
    for pos, req in enumerate(request.containers):
        if req is None or req.nums <= 0:
            continue
        is_init = pos < request.n_init
        outcome = _fit_nvidia(ctx, req, fresh() if is_init else app_state, node,
                              _quota_check(quota, request, placed, is_init), is_init)
        if not outcome.ok:
            return NodeFit(None, outcome.reason)
        grant[pos] = outcome.devices
        for device_index, profile, placement in outcome.mig:
            mig.append(MigAllocation(pos, device_index, outcome.devices[device_index].uuid,
                                     profile, placement))
        _hold_pod_mig(outcome, is_init, occupied, app_state)
        placed.append((is_init, outcome.devices))
    return NodeFit(tuple(grant), mig=tuple(mig))


def _hold_pod_mig(outcome: FitOutcome, is_init: bool, occupied: dict[str, list[MigPlacement]],
                  app_state: list[DeviceState]) -> None:
    """Keep a container's MIG instances out of the pod's other containers' way.

    Init containers are fitted on fresh copies of the node (their usage is not summed,
    HAMi v2.10), but the device plugin creates every instance of the pod at Allocate, so
    all of a pod's placements must be disjoint: later fresh copies (``occupied``) and the
    app containers' state see them. App containers' own placements are already in
    ``app_state`` (:func:`_fit_nvidia`).
    """
    for device_index, _, placement in outcome.mig:
        uuid = outcome.devices[device_index].uuid
        occupied.setdefault(uuid, []).append(placement)
        if is_init:
            for d in app_state:
                if d.info.uuid == uuid:
                    d.mig_occupied.append(placement)


def _fit_nvidia(ctx: FilterContext, req: ContainerDeviceRequest, state: list[DeviceState],
                node: NodeOptions, quota_ok: QuotaCheck | None, is_init: bool) -> FitOutcome:
    """One container's NVIDIA request on ``state`` (charged there for app containers)."""
    ordered = order_devices(state, req, ctx.pod, ctx.weights)
    outcome = fit_container(ordered, req, ctx.pod, node, quota_ok)
    if outcome.ok and not is_init:
        by_uuid = {d.info.uuid: d for d in state}
        for dev in outcome.devices:
            d = by_uuid[dev.uuid]
            d.used_slots += 1
            d.used_memory_mib += dev.used_memory_mib
            d.used_cores += dev.used_cores_percent
        for device_index, _, placement in outcome.mig:
            by_uuid[outcome.devices[device_index].uuid].mig_occupied.append(placement)
    return outcome


def _fit_node_vendors(ctx: FilterContext, entry: NodeEntry, quota: QuotaLedger | None,
                      fresh: Callable[[], list[DeviceState]], app_state: list[DeviceState],
                      node: NodeOptions, occupied: dict[str, list[MigPlacement]]) -> NodeFit:
    """:func:`fit_node` for a pod that asks for other vendors too (HAMi v2.10).

    Per container (init containers on fresh copies, app containers cumulative): the
    NVIDIA request first (the core's Fit, MIG included), then every other vendor's in
    CommonWord order through its backend, on that vendor's devices only.
    """
    request = ctx.request
    n = len(request.containers)
    grant: list[ContainerDevices] = [() for _ in range(n)]
    vgrant: dict[str, list[ContainerDevices]] = {w: [() for _ in range(n)]
                                                 for w in request.vendor_words}
    placed: list[tuple[bool, ContainerDevices]] = []
    mig: list[MigAllocation] = []
    vendor_options = PodOptions(gpu_policy=ctx.pod.gpu_policy)
    for pos, req in enumerate(request.containers):
        vreqs = request.vendors[pos] if pos < len(request.vendors) else {}
        wants_nvidia = req is not None and req.nums > 0
        if not wants_nvidia and not vreqs:
            continue
        is_init = pos < request.n_init
        state = fresh() if is_init else app_state
        if req is not None and wants_nvidia:
            outcome = _fit_nvidia(ctx, req, state, node,
                                  _quota_check(quota, request, placed, is_init), is_init)
            if not outcome.ok:
                return NodeFit(None, outcome.reason)
            grant[pos] = outcome.devices
            for device_index, profile, placement in outcome.mig:
                mig.append(MigAllocation(pos, device_index, outcome.devices[device_index].uuid,
                                         profile, placement))
            _hold_pod_mig(outcome, is_init, occupied, app_state)
            placed.append((is_init, outcome.devices))
        for word in sorted(vreqs):
            vendor = ctx.vendors.get(word)
            if vendor is None:
                return NodeFit(None, DEVICE_TYPE_NOT_FOUND)
            vreq = vreqs[word]
            mine = [d for d in state if d.info.vendor == word]
            if vreq.nums > len(mine):
                return NodeFit(None, NODE_INSUFFICIENT_DEVICE)
            earlier = tuple(vgrant[word][:pos])
            check = (ctx.vendor_quota.fit_check(request.namespace, word, earlier,
                                                request.n_init, pos)
                     if ctx.vendor_quota is not None else None)
            fit_ctx = FitContext(request.annotations, entry.annotations, entry.name,
                                 ctx.pod.gpu_policy, allocated=earlier, quota_ok=check)
            outcome = vendor.fit(order_devices(mine, vreq, vendor_options, ctx.weights),
                                 vreq, fit_ctx)
            if not outcome.ok:
                return NodeFit(None, outcome.reason)
            by_uuid = {d.info.uuid: d for d in mine}
            for dev in outcome.devices:
                target = by_uuid.get(dev.uuid)
                if target is None:
                    return NodeFit(None, f'Device with UUID "{dev.uuid}" not found on node '
                                   f"{entry.name} after Fit")
                vendor.add_usage(target, dev)
            vgrant[word][pos] = outcome.devices
    result = {w: tuple(g) for w, g in vgrant.items()}
    return NodeFit(tuple(grant), mig=tuple(mig), vendor_devices=result,
                   score_extra=_vendor_scores(ctx, entry, fresh(), result))


def _vendor_scores(ctx: FilterContext, entry: NodeEntry, base: list[DeviceState],
                   allocation: Mapping[str, PodSingleDevice]) -> float:
    """Σ ``ScoreNode`` of the granted vendors over the node's pre-existing usage (HAMi v2.10
    step 5); policy-neutral vendors weigh x10000, x-10000 under node policy spread."""
    extra = 0.0
    fit_ctx = FitContext(ctx.request.annotations, entry.annotations, entry.name,
                         ctx.pod.gpu_policy)
    for word, pod_grant in allocation.items():
        vendor = ctx.vendors[word]
        value = vendor.score_node([d for d in base if d.info.vendor == word], pod_grant,
                                  fit_ctx)
        if vendor.policy_neutral:
            value *= -POLICY_NEUTRAL_WEIGHT if ctx.node_policy == "spread" else POLICY_NEUTRAL_WEIGHT
        extra += value
    return extra


def _scores_nodes(vendors: Mapping[str, Vendor], words: Sequence[str]) -> bool:
    """True when a requested vendor's ``ScoreNode`` can be non-zero (it overrides the
    default 0, or it is policy-neutral), so the first fitting node is not enough."""
    return any(vendor.scores_nodes for word in words
               if (vendor := vendors.get(word)) is not None)


# ------------------------------------------------------------------ the loop
def filter_pod(request: PodRequest, ledger: UsageLedger, node_names: Sequence[str] | None,
               policy: SchedulingPolicy | None = None,
               quota: QuotaLedger | None = None, *,
               node_orders: Mapping[str, NodeOrder] | None = None,
               explain: bool = True,
               vendors: Mapping[str, Vendor] | None = None,
               vendor_quota: VendorQuota | None = None) -> FilterResult:
    """Choose a node and GPUs for ``request`` among ``node_names`` (None: every node).

    Pure with respect to the ledger: nothing is charged; the caller binds by
    ``ledger.add_pod``. Unknown node names fail with ``node unregistered``.
    ``node_orders`` adds or overrides node policies for this call (e.g. a
    fragmentation-aware order that knows the workload); with ``explain=False`` nodes the
    prefilter already excluded get no per-node reason when nothing fits (a simulator that
    reports no reasons skips that work; the decision is the same). ``vendors`` (the
    registry's non-NVIDIA backends) and ``vendor_quota`` serve the requests in
    ``request.vendors``; a vendor requested but not given fails every node with
    ``Device type not found``. A policy annotation with an unknown value is ignored for
    the configured policy and named in the result's ``policy_warnings``.

    Raises:
        FilterError: the pod's ``hami.io/device-scoring-weights`` annotation is malformed.
    """
    if not request.wants_devices:
        return FilterResult(node=None, passthrough=True)
    chosen = effective_policies(request.annotations, policy or SchedulingPolicy())
    ctx = FilterContext(ledger, request,
                        PodOptions.from_annotations(request.annotations, chosen.gpu_policy),
                        _weights(request), dict(vendors or {}), vendor_quota,
                        chosen.node_policy)
    result = _filter(ctx, node_names, quota, node_orders, explain)
    if chosen.warnings:
        return replace(result, policy_warnings=chosen.warnings)
    return result


def _filter(ctx: FilterContext, node_names: Sequence[str] | None, quota: QuotaLedger | None,
            node_orders: Mapping[str, NodeOrder] | None, explain: bool) -> FilterResult:
    """:func:`filter_pod` once the pod's policies and options are resolved."""
    ledger, request = ctx.ledger, ctx.request
    failed: dict[str, str] = {}
    idx = ledger.indices(node_names)
    if node_names is not None and (idx < 0).any():
        for name, i in zip(node_names, idx, strict=True):
            if i < 0:
                failed[name] = NODE_UNREGISTERED
        idx = idx[idx >= 0]
    possible = _node_mask(ledger, request, ctx.pod)[idx]
    orders = {**NODE_ORDERS, **node_orders} if node_orders else NODE_ORDERS
    if request.vendors:
        return _filter_vendors(ctx, idx, possible, orders, quota, failed, explain)
    order = orders.get(ctx.node_policy, _binpack_nodes)(ctx, idx[possible])
    for i in order:
        entry = ledger.node(ledger.node_name(int(i)))
        assert entry is not None
        fit = fit_node(ctx, entry, quota)
        if fit.devices is not None:
            return FilterResult(node=entry.name, devices=fit.devices,
                                score=ledger.node_score(int(i)), mig=fit.mig)
        failed[entry.name] = fit.reason
    for i in idx[~possible] if explain else ():
        entry = ledger.node(ledger.node_name(int(i)))
        assert entry is not None
        fit = fit_node(ctx, entry, quota)
        if fit.devices is not None:  # the prefilter is a necessary condition; never trust it more
            return FilterResult(node=entry.name, devices=fit.devices,
                                score=ledger.node_score(int(i)), mig=fit.mig)
        failed[entry.name] = fit.reason
    return FilterResult(node=None, failed_nodes=failed)


def _filter_vendors(ctx: FilterContext, idx: IntArray, possible: BoolArray,
                    orders: Mapping[str, NodeOrder], quota: QuotaLedger | None,
                    failed: dict[str, str], explain: bool) -> FilterResult:
    """The node loop for a pod that asks for other vendors (HAMi v2.10 steps 5-7, HAMi v2.10).

    Candidates are ranked by the node policy as for NVIDIA (the fragmentation-aware
    order knows GPU shares only, so binpack ranks vendor pods there). Without a scoring
    vendor the first node that fits wins, exactly as for NVIDIA; otherwise every
    candidate is fitted and the highest (binpack) or lowest (spread) adjusted score wins,
    ties in the policy's order.
    """
    ledger = ctx.ledger
    rank = orders.get(ctx.node_policy, _binpack_nodes)
    if ctx.node_policy == "fragmentation-aware":
        rank = _binpack_nodes
    order = rank(ctx, idx[possible])
    scoring = _scores_nodes(ctx.vendors, ctx.request.vendor_words)
    fits: list[tuple[float, int, NodeEntry, NodeFit]] = []
    for pos, i in enumerate(order):
        entry = ledger.node(ledger.node_name(int(i)))
        assert entry is not None
        fit = fit_node(ctx, entry, quota)
        if fit.devices is None:
            failed[entry.name] = fit.reason
            continue
        score = ledger.node_score(int(i)) + fit.score_extra
        if not scoring:
            return _vendor_result(entry, fit, score)
        key = score if ctx.node_policy == "spread" else -score
        fits.append((key, pos, entry, fit))
    if fits:
        _, _, entry, fit = min(fits, key=lambda t: (t[0], t[1]))
        i = entry.index
        return _vendor_result(entry, fit, ledger.node_score(i) + fit.score_extra)
    for i in idx[~possible] if explain else ():
        entry = ledger.node(ledger.node_name(int(i)))
        assert entry is not None
        fit = fit_node(ctx, entry, quota)
        if fit.devices is not None:  # the prefilter is a necessary condition; never trust it more
            return _vendor_result(entry, fit, ledger.node_score(int(i)) + fit.score_extra)
        failed[entry.name] = fit.reason
    return FilterResult(node=None, failed_nodes=failed)


def _vendor_result(entry: NodeEntry, fit: NodeFit, score: float) -> FilterResult:
    assert fit.devices is not None
    return FilterResult(node=entry.name, devices=fit.devices, score=score, mig=fit.mig,
                        vendor_devices=fit.vendor_devices)
