"""The filter decision: which node and which devices for one pod (HAMi ``Scheduler.Filter``).

Source (HAMi v2.10): (flow), (calcScore: init containers on fresh copies, app containers
cumulative, node score = pre-existing usage), (node ordering). The live extender,
``hami schedule`` and the simulator all call :func:`filter_pod`.

One loop for every pod, whatever vendors it asks for. How it stays fast: the node score
does not depend on the pod being placed (HAMi v2.10 quirk 3, kept), so instead of fitting
every node and sorting, we (1) drop in one vectorised pass every node that cannot host
some container even alone (:mod:`hami.core.prefilter`, a necessary condition of the exact
check), (2) order the remaining nodes by the node policy, and (3) run the exact fit
(:mod:`hami.core.nodefit`) on them in that order, stopping at the first that fits. The
answer is the one HAMi would choose; exact reasons for every node are computed only when
no node fits (that is when ``FailedNodes`` is reported).

When a requested vendor scores nodes (``Vendor.scores_nodes``: its ``ScoreNode`` can be
non-zero), every candidate is fitted and the best adjusted score wins (HAMi v2.10 steps
5-7); the fragmentation-aware order knows GPU shares only, so binpack ranks pods that ask
for other vendors there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from hami.api import names
from hami.core.codec import (
    CodecError,
    MigAllocation,
    ScoringWeights,
    parse_scoring_weights,
)
from hami.core.config import SchedulingPolicy, effective_policies
from hami.core.fit import PodOptions
from hami.core.fragmentation import LiveFragmentationOrder
from hami.core.ledger import NodeEntry, UsageLedger
from hami.core.model import (
    PodRequest,
    PodSingleDevice,
)
from hami.core.nodefit import (
    BestFirst,
    FilterContext,
    NodeFit,
    NodeOrder,
    fit_node,
    scores_nodes,
)
from hami.core.prefilter import node_mask
from hami.core.quota import QuotaLedger
from hami.core.vendor import Vendor
from hami.core.vendor_quota import VendorQuota

NODE_UNREGISTERED = "node unregistered"

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


def _binpack_nodes(ctx: FilterContext, idx: IntArray) -> IntArray | BestFirst:
    if idx.size == 0:
        return idx
    scores = ctx.ledger.node_scores()[idx]  # never NaN: argmax is the sort's first
    return BestFirst(int(idx[np.argmax(scores)]),
                     lambda: idx[np.argsort(-scores, kind="stable")])


def _spread_nodes(ctx: FilterContext, idx: IntArray) -> IntArray | BestFirst:
    if idx.size == 0:
        return idx
    scores = ctx.ledger.node_scores()[idx]
    return BestFirst(int(idx[np.argmin(scores)]),
                     lambda: idx[np.argsort(scores, kind="stable")])


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
                        PodOptions.from_annotations(request.annotations, chosen.gpu_policy,
                                                    request.share_filters),
                        _weights(request), dict(vendors or {}), vendor_quota,
                        chosen.node_policy)
    result = _filter(ctx, node_names, quota, node_orders, explain)
    if chosen.warnings:
        return replace(result, policy_warnings=chosen.warnings)
    return result


def _filter(ctx: FilterContext, node_names: Sequence[str] | None, quota: QuotaLedger | None,
            node_orders: Mapping[str, NodeOrder] | None, explain: bool) -> FilterResult:
    """:func:`filter_pod` once the pod's policies and options are resolved: rank the
    prefilter's candidates, fit them in that order; without a scoring vendor the first
    node that fits wins, otherwise the highest (binpack) or lowest (spread) adjusted
    score, ties in the policy's order."""
    ledger, request = ctx.ledger, ctx.request
    failed: dict[str, str] = {}
    idx = ledger.indices(node_names)
    if node_names is not None and (idx < 0).any():
        for name, i in zip(node_names, idx, strict=True):
            if i < 0:
                failed[name] = NODE_UNREGISTERED
        idx = idx[idx >= 0]
    possible = node_mask(ledger, request, ctx.pod, ctx.vendors)[idx]
    orders = {**NODE_ORDERS, **node_orders} if node_orders else NODE_ORDERS
    rank = orders.get(ctx.node_policy, _binpack_nodes)
    if request.vendors and ctx.node_policy == "fragmentation-aware":
        rank = _binpack_nodes
    scoring = bool(request.vendors) and scores_nodes(ctx.vendors, request.vendor_words)
    best: tuple[float, NodeEntry, NodeFit] | None = None
    for i in rank(ctx, idx[possible]):
        entry, fit = _fit(ctx, int(i), quota)
        if fit.devices is None:
            failed[entry.name] = fit.reason
            continue
        score = ledger.node_score(entry.index) + fit.score_extra
        if not scoring:
            return _result(entry, fit, score)
        key = score if ctx.node_policy == "spread" else -score
        if best is None or key < best[0]:
            best = (key, entry, fit)
    if best is not None:
        _, entry, fit = best
        return _result(entry, fit, ledger.node_score(entry.index) + fit.score_extra)
    for i in idx[~possible] if explain else ():
        entry, fit = _fit(ctx, int(i), quota)
        if fit.devices is not None:  # the prefilter is a necessary condition; never trust it more
            return _result(entry, fit, ledger.node_score(entry.index) + fit.score_extra)
        failed[entry.name] = fit.reason
    return FilterResult(node=None, failed_nodes=failed)


def _fit(ctx: FilterContext, i: int, quota: QuotaLedger | None) -> tuple[NodeEntry, NodeFit]:
    entry = ctx.ledger.node(ctx.ledger.node_name(i))
    assert entry is not None
    return entry, fit_node(ctx, entry, quota)


def _result(entry: NodeEntry, fit: NodeFit, score: float) -> FilterResult:
    assert fit.devices is not None
    return FilterResult(node=entry.name, devices=fit.devices, score=score, mig=fit.mig,
                        vendor_devices=fit.vendor_devices)
