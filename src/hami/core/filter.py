"""The filter decision: which node and which GPUs for one pod (HAMi ``Scheduler.Filter``).

Source: ``shared/specs/hami-scheduler-spec.md`` §4.2 (flow), §4.4 (calcScore: init
containers on fresh copies, app containers cumulative, node score = pre-existing usage),
§4.8 (node ordering). The live extender, ``hami schedule`` and the simulator all call
:func:`filter_pod`.

How it stays fast: the node score does not depend on the pod being placed (spec §12
quirk 3, kept), so instead of fitting every node and sorting, we (1) drop in one
vectorised pass every node that cannot host some container even alone (a necessary
condition of the exact check), (2) order the remaining nodes by the node policy, and
(3) run the exact HAMi ``Fit`` on them in that order, stopping at the first that fits.
The answer is the one HAMi would choose; exact reasons for every node are computed only
when no node fits (that is when ``FailedNodes`` is reported).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

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
from hami.core.config import SchedulingPolicy
from hami.core.fit import (
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
    PodRequest,
    PodSingleDevice,
)
from hami.core.quota import QuotaLedger
from hami.core.score import order_devices

NODE_UNREGISTERED = "node unregistered"
INSUFFICIENT_CPU = "Insufficient cpu"
INSUFFICIENT_MEMORY = "Insufficient memory"

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


class FilterError(ValueError):
    """The pod itself is unusable for filtering (e.g. a malformed weights annotation)."""


@dataclass(frozen=True, slots=True)
class FilterResult:
    """Outcome of one filter.

    ``passthrough`` is True for a pod that asks for no device (every node passes, nothing
    is written). Otherwise ``node`` is the chosen node (None when nothing fits), ``devices``
    the grant per container (init first) and ``failed_nodes`` the reason per node that was
    found unfit (filled completely only when nothing fits, as HAMi does).
    """

    node: str | None
    devices: PodSingleDevice = ()
    failed_nodes: dict[str, str] = field(default_factory=dict)
    passthrough: bool = False
    score: float = 0.0
    mig: tuple[MigAllocation, ...] = ()


@dataclass(frozen=True, slots=True)
class FilterContext:
    """What the policies need to rank candidates for one pod."""

    ledger: UsageLedger
    request: PodRequest
    pod: PodOptions
    weights: ScoringWeights


#: Node policies: candidate node indices (input order) -> the same indices best first.
NodeOrder = Callable[[FilterContext, IntArray], IntArray]


def _binpack_nodes(ctx: FilterContext, idx: IntArray) -> IntArray:
    scores = ctx.ledger.node_scores()[idx]
    return idx[np.argsort(-scores, kind="stable")]


def _spread_nodes(ctx: FilterContext, idx: IntArray) -> IntArray:
    scores = ctx.ledger.node_scores()[idx]
    return idx[np.argsort(scores, kind="stable")]


#: Node policies (spec §4.8): binpack takes the most used node, spread the least used;
#: ties keep the caller's node order. ``fragmentation-aware`` (ours, after FGD, USENIX
#: ATC'23) takes the node where the expected fragmentation of the running workload's task
#: mix grows least; the mix is learned from the pods the ledger holds.
NODE_ORDERS: dict[str, NodeOrder] = {
    "binpack": _binpack_nodes,
    "spread": _spread_nodes,
    "fragmentation-aware": LiveFragmentationOrder(),
}


def effective_policies(request: PodRequest, policy: SchedulingPolicy) -> tuple[str, str]:
    """``(node_policy, gpu_policy)`` after the pod's annotation overrides (spec §2.2)."""
    ann = request.annotations
    node_policy = ann.get(names.NODE_SCHEDULER_POLICY, "").strip() or policy.node_policy
    gpu_policy = ann.get(names.GPU_SCHEDULER_POLICY, "").strip() or policy.gpu_policy
    return node_policy, gpu_policy


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
    """Exact fit of a whole pod on one node: the grant, or the reason it does not fit."""

    devices: PodSingleDevice | None
    reason: str = ""
    mig: tuple[MigAllocation, ...] = ()


def fit_node(ctx: FilterContext, entry: NodeEntry, quota: QuotaLedger | None = None) -> NodeFit:
    """Exact HAMi fit of every container of the pod on one node (spec §4.4 steps 1-2)."""
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
    for pos, req in enumerate(request.containers):
        if req is None or req.nums <= 0:
            continue
        is_init = pos < request.n_init
        state = fresh() if is_init else app_state
        ordered = order_devices(state, req, ctx.pod, ctx.weights)
        outcome: FitOutcome = fit_container(ordered, req, ctx.pod, node,
                                            _quota_check(quota, request, placed, is_init))
        if not outcome.ok:
            return NodeFit(None, outcome.reason)
        grant[pos] = outcome.devices
        for device_index, profile, placement in outcome.mig:
            mig.append(MigAllocation(pos, device_index, outcome.devices[device_index].uuid,
                                     profile, placement))
        placed.append((is_init, outcome.devices))
        if not is_init:
            by_uuid = {d.info.uuid: d for d in app_state}
            for dev in outcome.devices:
                d = by_uuid[dev.uuid]
                d.used_slots += 1
                d.used_memory_mib += dev.used_memory_mib
                d.used_cores += dev.used_cores_percent
            for device_index, _, placement in outcome.mig:
                by_uuid[outcome.devices[device_index].uuid].mig_occupied.append(placement)
    return NodeFit(tuple(grant), mig=tuple(mig))


# ------------------------------------------------------------------ the loop
def filter_pod(request: PodRequest, ledger: UsageLedger, node_names: Sequence[str] | None,
               policy: SchedulingPolicy | None = None,
               quota: QuotaLedger | None = None, *,
               node_orders: Mapping[str, NodeOrder] | None = None,
               explain: bool = True) -> FilterResult:
    """Choose a node and GPUs for ``request`` among ``node_names`` (None: every node).

    Pure with respect to the ledger: nothing is charged; the caller binds by
    ``ledger.add_pod``. Unknown node names fail with ``node unregistered``.
    ``node_orders`` adds or overrides node policies for this call (e.g. a
    fragmentation-aware order that knows the workload); with ``explain=False`` nodes the
    prefilter already excluded get no per-node reason when nothing fits (a simulator that
    reports no reasons skips that work; the decision is the same).

    Raises:
        FilterError: the pod's ``hami.io/device-scoring-weights`` annotation is malformed.
    """
    if not request.wants_devices:
        return FilterResult(node=None, passthrough=True)
    policy = policy or SchedulingPolicy()
    node_policy, gpu_policy = effective_policies(request, policy)
    ctx = FilterContext(ledger, request,
                        PodOptions.from_annotations(request.annotations, gpu_policy),
                        _weights(request))
    failed: dict[str, str] = {}
    idx = ledger.indices(node_names)
    if node_names is not None and (idx < 0).any():
        for name, i in zip(node_names, idx, strict=True):
            if i < 0:
                failed[name] = NODE_UNREGISTERED
        idx = idx[idx >= 0]
    possible = _node_mask(ledger, request, ctx.pod)[idx]
    orders = {**NODE_ORDERS, **node_orders} if node_orders else NODE_ORDERS
    order = orders.get(node_policy, _binpack_nodes)(ctx, idx[possible])
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
