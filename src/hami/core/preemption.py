"""Preemption for GPU slices: which node, and which lower-priority pods to evict there so
that a pod that fits nowhere fits, device by device.

Pure: it reads a :class:`~hami.core.state.ClusterState` and answers a value. The dry run
takes charges off the state and puts them back (:meth:`ClusterState.lift`,
:meth:`ClusterState.put_back`) before it returns, raising or not, so callers see the
state unchanged (the very same ledger entries).

Algorithm: kube-scheduler's default preemption (``pkg/scheduler/framework/preemption``
and ``plugins/defaultpreemption``, Kubernetes v1.37), with hami's own fit in place of
the in-tree Filter plugins, which ignore device memory, cores and slots:

* per node (``selectVictimsOnNode``): take off every pod of lower priority than the
  preemptor; if the pod does not fit even then, the node is no candidate. Otherwise put
  the pods back one at a time, most important first (higher priority, then earlier
  start), those whose eviction would violate a PodDisruptionBudget before the others;
  a pod that can come back while the preemptor still fits is reprieved, the others are
  the victims. The fit is :func:`hami.core.filter.filter_pod` on that node alone: the
  right card model, memory, cores, task slots, MIG instances, NUMA and namespace quota;
* PDB violations (``filterPodsWithPDBViolation``): over the node's lower-priority pods
  in that order, each covering budget's ``disruptionsAllowed`` is decremented; a pod
  that takes one below zero violates it;
* node choice (``pickOneNodeForPreemption``): fewest PDB violations, then the lowest
  highest-victim priority, then the smallest sum of priorities, then the fewest victims,
  then the latest start of the earliest-started highest-priority victim, then the first
  node in the given order.

Never a pod of equal or higher priority, never a pod whose slice is not needed, and no
plan at all when the pod would not fit on any node with every lower-priority pod gone.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami.core.filter import FilterResult, filter_pod
from hami.core.ledger import PodEntry
from hami.core.model import DeviceCharge, PodRequest, PodSingleDevice
from hami.core.podobjects import pod_uid
from hami.core.podpriority import PodPriority, may_preempt, pod_priority
from hami.core.request import pod_request
from hami.core.state import ClusterState, Lifted

#: Reasons a node offers no preemption (kept short: they end up in Events).
NO_LOWER = "no lower-priority pod holds devices on the node"
NO_FIT = "would not fit even with every lower-priority pod gone"
BUSY = "a preemption is already in flight on the node"
#: ``int32`` max + 1, added to each priority before summing (kube-scheduler does the
#: same so negative priorities sum the right way round).
_OFFSET = 2**31


@dataclass(frozen=True, slots=True)
class Victim:
    """A pod to evict: who, its priority, whether evicting it violates a PDB, and the
    slices it frees (its charges: card UUID, MiB, percent of cores, task slots)."""

    uid: str
    namespace: str
    name: str
    priority: int
    start_ns: int | None
    violates_budget: bool
    freed: tuple[DeviceCharge, ...]


@dataclass(frozen=True, slots=True)
class PreemptionPlan:
    """Where the preemptor goes once ``victims`` are gone, and on which cards.

    ``devices``/``mig``/``vendor_devices`` are the grant :func:`filter_pod` chose on the
    node with the victims gone (the preemptor's would-be allocation); ``violations`` how
    many victims violate a PodDisruptionBudget; ``request`` the preemptor's parsed request
    (what a reservation charges: :meth:`ClusterState.charge` of ``devices``).
    """

    node: str
    victims: tuple[Victim, ...]
    result: FilterResult
    violations: int
    request: PodRequest

    @property
    def devices(self) -> PodSingleDevice:
        return self.result.devices

    def cards(self) -> tuple[str, ...]:
        """UUIDs of the cards the preemptor would use, in grant order, each once."""
        seen: dict[str, None] = {}
        for container in self.devices:
            for dev in container:
                seen.setdefault(dev.uuid, None)
        for grant in self.result.vendor_devices.values():
            for container in grant:
                for dev in container:
                    seen.setdefault(dev.uuid, None)
        return tuple(seen)

    def freed_on_cards(self) -> dict[str, tuple[int, int, int]]:
        """Per card of the preemptor: ``(memory_mib, cores_percent, slots)`` the victims
        free there."""
        cards = self.cards()
        out = {uuid: (0, 0, 0) for uuid in cards}
        for victim in self.victims:
            for charge in victim.freed:
                if charge.uuid in out:
                    m, c, s = out[charge.uuid]
                    out[charge.uuid] = (m + charge.memory_mib, c + charge.cores_percent,
                                        s + charge.slots)
        return out

    def describe(self) -> str:
        """One line for Events and ``hami schedule``: node, cards, victims, freed slice."""
        freed = ", ".join(f"{uuid}: {m} MiB, {c}% cores, {s} slots"
                          for uuid, (m, c, s) in self.freed_on_cards().items())
        who = ", ".join(f"{v.namespace}/{v.name} (priority {v.priority})" for v in self.victims)
        return (f"node {self.node}, card(s) {', '.join(self.cards())}: evict {who or 'nobody'}"
                f"; frees {freed or 'nothing on those cards'}")


@dataclass(frozen=True, slots=True)
class PreemptionOutcome:
    """A plan (None when no node can host the pod by preemption) and, per node that
    offered none, why."""

    plan: PreemptionPlan | None
    reasons: dict[str, str] = field(default_factory=dict)


def _importance(info: PodPriority) -> tuple[int, int]:
    """Sort key, most important first: higher priority, then earlier start (unknown
    start counts as the latest), as kube-scheduler's ``MoreImportantPod``."""
    start = info.start_ns if info.start_ns is not None else 2**63
    return (-info.priority, start)


def _violating(ordered: Sequence[PodPriority], budgets: Mapping[str, int]) -> set[str]:
    """Uids among ``ordered`` whose eviction violates a budget (``filterPodsWithPDBViolation``)."""
    left = dict(budgets)
    out: set[str] = set()
    for info in ordered:
        for key in info.budgets:
            if key not in left:
                continue
            left[key] -= 1
            if left[key] < 0:
                out.add(info.uid)
    return out


def _fits(state: ClusterState, request: PodRequest, node: str) -> FilterResult:
    return filter_pod(request, state.ledger, [node], state.config.policy, state.quota,
                      vendors=state.vendors, vendor_quota=state.vendor_quota)


def _victims_on(state: ClusterState, request: PodRequest, node: str,
                lower: list[PodEntry], infos: Mapping[str, PodPriority],
                budgets: Mapping[str, int]) -> PreemptionPlan | str:
    """``selectVictimsOnNode`` with hami's fit; the plan or why there is none."""
    lifted: dict[str, Lifted] = {}
    try:
        for entry in lower:
            held = state.lift(entry.uid)
            if held is not None:
                lifted[entry.uid] = held
        if _fits(state, request, node).node is None:
            return NO_FIT
        ordered = sorted((infos[e.uid] for e in lower), key=_importance)
        violating = _violating(ordered, budgets)
        victims: list[PodPriority] = []
        for group in ([i for i in ordered if i.uid in violating],
                      [i for i in ordered if i.uid not in violating]):
            for info in group:
                state.put_back(lifted[info.uid])
                if _fits(state, request, node).node is not None:
                    del lifted[info.uid]  # reprieved: it stays
                    continue
                again = state.lift(info.uid)
                assert again is not None
                lifted[info.uid] = again
                victims.append(info)
        final = _fits(state, request, node)
        assert final.node == node  # every victim is off again: the first fit holds
        victims.sort(key=_importance)
        out = tuple(Victim(v.uid, lifted[v.uid].entry.namespace, lifted[v.uid].entry.name,
                           v.priority, v.start_ns, v.uid in violating,
                           lifted[v.uid].entry.charges) for v in victims)
        return PreemptionPlan(node, out, final, sum(v.violates_budget for v in out), request)
    finally:
        for held in lifted.values():
            state.put_back(held)


def _earliest_top_start(plan: PreemptionPlan) -> int:
    top = plan.victims[0].priority
    starts = [v.start_ns if v.start_ns is not None else 2**63
              for v in plan.victims if v.priority == top]
    return min(starts)


def _choice_key(plan: PreemptionPlan) -> tuple[int, int, int, int, int]:
    """``pickOneNodeForPreemption`` as one ascending key (earlier wins)."""
    if not plan.victims:
        return (0, -(2**40), 0, 0, 0)
    return (plan.violations, plan.victims[0].priority,
            sum(v.priority + _OFFSET for v in plan.victims), len(plan.victims),
            -_earliest_top_start(plan))


def plan_preemption(state: ClusterState, pod: Mapping[str, Any],
                    infos: Mapping[str, PodPriority], budgets: Mapping[str, int] | None = None,
                    node_names: Sequence[str] | None = None, *,
                    busy_nodes: Collection[str] = ()) -> PreemptionOutcome:
    """The preemption that lets ``pod`` fit, or none.

    ``state``: the cluster (the ledger's charged pods are the possible victims).
    ``pod``: the preemptor (JSON; ``spec.priority``, ``spec.preemptionPolicy``).
    ``infos``: per charged pod uid, its priority, start and covering budgets
    (:func:`hami.core.podpriority.pod_priority_info`); a charged pod missing here is never
    a victim (pods already terminating should be left out by the caller).
    ``budgets``: per PodDisruptionBudget key, ``status.disruptionsAllowed``.
    ``node_names``: candidate nodes in preference order (None: every registered node).
    ``busy_nodes``: nodes with a preemption in flight, offered nothing.

    A pod with ``preemptionPolicy: Never`` or without device requests gets no plan. The
    preemptor's own charge (a reservation, an earlier filter) is left out during the dry
    run and put back.

    Raises:
        RequestError: the pod's device request is malformed (as :meth:`ClusterState.filter`).
        FilterError: a pod annotation the filter reads is malformed.
    """
    request = pod_request(pod, state.config.registry)
    if not request.wants_devices or not may_preempt(pod):
        return PreemptionOutcome(None)
    priority = pod_priority(pod)
    uid = pod_uid(pod)
    own = state.lift(uid)
    reasons: dict[str, str] = {}
    best: PreemptionPlan | None = None
    try:
        for node in node_names if node_names is not None else state.ledger.node_names():
            if state.ledger.node(node) is None:
                reasons[node] = "node unregistered"
                continue
            if node in busy_nodes:
                reasons[node] = BUSY
                continue
            lower = [e for e in state.ledger.pods_on(node)
                     if (i := infos.get(e.uid)) is not None and i.priority < priority]
            if not lower:
                fits = _fits(state, request, node)
                if fits.node is None:
                    reasons[node] = NO_LOWER
                    continue
                bare = PreemptionPlan(node, (), fits, 0, request)
                if best is None or _choice_key(bare) < _choice_key(best):
                    best = bare
                continue
            lower.sort(key=lambda e: e.uid)  # the set's order must not decide anything
            found = _victims_on(state, request, node, lower, infos, budgets or {})
            if isinstance(found, str):
                reasons[node] = found
                continue
            if best is None or _choice_key(found) < _choice_key(best):
                best = found
    finally:
        if own is not None:
            state.put_back(own)
    return PreemptionOutcome(best, reasons)


def fits_once_gone(state: ClusterState, pod: Mapping[str, Any], leaving: Collection[str],
                   node_names: Sequence[str] | None = None) -> str | None:
    """The node where ``pod`` fits once the pods ``leaving`` (uids: victims of
    preemptions in flight, already evicted) are gone, or None. A preemptor that would
    fit there waits instead of evicting more (no more victims than needed in total).
    The state is unchanged on return.

    Raises:
        RequestError, FilterError: as :func:`plan_preemption`.
    """
    request = pod_request(pod, state.config.registry)
    if not request.wants_devices or not leaving:
        return None
    lifted = [held for uid in [pod_uid(pod), *leaving] if (held := state.lift(uid)) is not None]
    try:
        result = filter_pod(request, state.ledger, node_names, state.config.policy,
                            state.quota, vendors=state.vendors,
                            vendor_quota=state.vendor_quota, explain=False)
        return result.node
    finally:
        for held in lifted:
            state.put_back(held)


__all__ = ["BUSY", "NO_FIT", "NO_LOWER", "PreemptionOutcome", "PreemptionPlan", "Victim",
           "fits_once_gone", "plan_preemption"]
