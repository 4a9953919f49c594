"""Preemption in extender mode: when ``/filter`` finds no node for a pod whose
``preemptionPolicy`` is not ``Never``, evict the fewest lower-priority pods whose GPU
slices let it fit, the Kubernetes way.

kube-scheduler's own preemption cannot do this for hami's resources: its dry run runs
only in-tree Filter plugins, which ignore device memory, cores and slots, so it finds no
victim ("preemption: expected at least one victim pod"). The decision is the core's
(:func:`hami.core.preemption.plan_preemption`); this shell carries it out:

* a **reservation**: the preemptor is charged in the ledger on the chosen node and cards
  at once (above the victims' charges until they leave), so the freed slice goes to it
  and not to the next pod in the queue; it expires after :data:`RESERVATION_TTL_S`;
* ``status.nominatedNodeName``, the Eviction API, the Events and the metrics of
  :func:`hami.scheduler.evictions.carry_out` (shared with DRA mode); a refused eviction
  drops the candidate: the reservation is released and that node is left out for this
  pod for :data:`REFUSED_TTL_S` (another node or a wait);
* one preemption in flight per node: a node whose reservation still waits for victims
  is offered to no other preemptor.

While its victims are still there the preemptor's ``/filter`` answers "waiting"; once
they are gone the reservation is released and the pod is filtered onto the reserved node
first (the slice nobody else could take).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hami.api import names
from hami.core.codec import CodecError
from hami.core.filter import FilterError
from hami.core.podpriority import (
    Budget,
    may_preempt,
    pod_priority,
    pod_priority_info,
    rfc3339_ns,
)
from hami.core.preemption import PreemptionPlan, fits_once_gone, plan_preemption
from hami.core.request import RequestError
from hami.core.state import TERMINAL_PHASES, pod_uid
from hami.extender.wire import PreemptArgs, preempt_result
from hami.kube import KubeError
from hami.scheduler.evictions import PREEMPTED, PREEMPTING, PREEMPTION_REFUSED, carry_out
from hami.scheduler.parts import EngineParts
from hami.scheduler.podcache import UnknownPod

log = logging.getLogger("hami.scheduler.preemption")

JSON = dict[str, Any]
#: A reservation whose preemptor never came back is released after this long.
RESERVATION_TTL_S = 300.0
#: A node where an eviction for a pod was refused is not tried again for it this long.
REFUSED_TTL_S = 60.0


@dataclass(slots=True)
class Reservation:
    """A preemption in flight: the preemptor's charge on ``node`` while ``victims``
    (uids) leave."""

    node: str
    victims: frozenset[str]
    entry: Any
    since: float
    description: str
    #: uid -> (namespace, name) of each victim, to ask the API whether it is gone.
    names: dict[str, tuple[str, str]]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _trimmed(pod: Mapping[str, Any]) -> JSON:
    """What preemption keeps of a charged pod (priority, start, labels, identity)."""
    meta = _meta(pod)
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    status = pod.get("status") if isinstance(pod.get("status"), Mapping) else {}
    return {"metadata": {k: meta.get(k) for k in ("name", "namespace", "uid", "labels",
                                                  "creationTimestamp")},
            "spec": {"priority": (spec or {}).get("priority")},
            "status": {"startTime": (status or {}).get("startTime")}}


class PreemptFlow(EngineParts):
    """The engine's preemption (a mixin of :class:`~hami.scheduler.engine.Engine`)."""

    _reservations: dict[str, Reservation]
    _refused: dict[tuple[str, str], float]
    #: Charged, running pods that may be victims: uid -> trimmed pod.
    _victim_pods: dict[str, JSON]
    #: Preemptors (uid) -> creation time (Unix s), for the time-to-bound metric.
    _preemptors: dict[str, float]
    #: Pods hami evicted (uid) -> when (monotonic s): their slices are coming, whether
    #: or not the preemptor that evicted them is still there (kept until they are gone).
    _evicted: dict[str, float]

    def _init_preemption(self) -> None:
        self._reservations = {}
        self._refused = {}
        self._victim_pods = {}
        self._preemptors = {}
        self._evicted = {}

    # ------------------------------------------------------------- pod cache
    def track_victim(self, pod: Mapping[str, Any], deleted: bool) -> None:
        """Keep what preemption needs of pods holding devices (called per pod event).
        A pod being deleted is no candidate (it leaves anyway)."""
        uid = pod_uid(pod)
        meta = _meta(pod)
        phase = (pod.get("status") or {}).get("phase")
        if deleted:
            self._victim_pods.pop(uid, None)
            self._drop_reservation(uid)
            self._preemptors.pop(uid, None)
            self._evicted.pop(uid, None)
            return
        annotations = meta.get("annotations") or {}
        if (not annotations.get(names.VGPU_NODE) or phase in TERMINAL_PHASES
                or meta.get("deletionTimestamp")):
            self._victim_pods.pop(uid, None)
            return
        self._victim_pods[uid] = _trimmed(pod)

    def forget_unlisted_victims(self, listed: set[Any]) -> None:
        """A relist: pods not listed are gone (their DELETED event was missed)."""
        for uid in [u for u in self._victim_pods if u not in listed]:
            del self._victim_pods[uid]
        for uid in [u for u in self._reservations if u not in listed]:
            self._drop_reservation(uid)
        for uid in [u for u in self._evicted if u not in listed]:
            del self._evicted[uid]

    # ----------------------------------------------------------- reservations
    def _drop_reservation(self, uid: str) -> None:
        held = self._reservations.pop(uid, None)
        if held is not None and self.state.ledger.pod(uid) is held.entry:
            self.state.remove_pod(uid)
            self._committed_at.pop(uid, None)

    def _live_reservation(self, uid: str) -> Reservation | None:
        held = self._reservations.get(uid)
        if held is None:
            return None
        if (time.monotonic() - held.since > RESERVATION_TTL_S
                or self.state.ledger.pod(uid) is not held.entry):
            self._drop_reservation(uid)
            return None
        return held

    def expire_reservations(self) -> None:
        """Release every reservation older than :data:`RESERVATION_TTL_S` (called before
        each filter: a preemptor that is never filtered again, e.g. one kube-scheduler's
        own filters now reject, must not hold its card for ever)."""
        for uid in list(self._reservations):
            self._live_reservation(uid)

    def _waiting_for(self, held: Reservation) -> list[str]:
        return [v for v in held.victims if self.state.ledger.pod(v) is not None]

    def preemption_gate(self, uid: str) -> tuple[str | None, str]:
        """Before a pod's filter: ``(node, "")`` when its victims are gone (the
        reservation is handed back; filter that node first), ``(node, why)`` while they
        are still there (answer that), ``(None, "")`` without a reservation."""
        held = self._live_reservation(uid)
        if held is None:
            return None, ""
        waiting = self._waiting_for(held)
        if waiting:
            return held.node, (f"waiting for {len(waiting)} preemption victim(s) to leave "
                               f"node {held.node}")
        self._drop_reservation(uid)
        return held.node, ""

    async def confirm_victims(self, uid: str) -> bool:
        """The pod's preemption still waits for victims: ask the API whether they are
        gone (a missed or late DELETED event must not hold the slice for ever); the
        charge of each one gone (404, or another pod under its name) is released.
        Returns whether any was."""
        held = self._live_reservation(uid)
        if held is None:
            return False
        released = False
        for victim in self._waiting_for(held):
            namespace, name = held.names.get(victim, ("", ""))
            try:
                now = await self.kube.get_pod(namespace, name) if name else {}
            except KubeError:
                continue
            if now is None or pod_uid(now) != victim:
                self.state.remove_pod(victim)
                self._victim_pods.pop(victim, None)
                self._committed_at.pop(victim, None)
                released = True
        return released

    def _leaving(self) -> set[str]:
        """Pods whose slices are coming: victims of live reservations, and every pod
        hami evicted that is still charged."""
        return {v for other in list(self._reservations)
                if (held := self._live_reservation(other)) is not None
                for v in self._waiting_for(held)} | self._still_leaving()

    def _still_leaving(self) -> set[str]:
        """Pods hami evicted that still hold their slices (their preemptor may be gone: a
        preemptor deleted and created again must wait for them, not evict more). They
        count until they are gone, past :data:`RESERVATION_TTL_S` too (a victim with a
        long grace period must not cost one more eviction per TTL), as kube-scheduler
        waits for terminating victims on a nominated node."""
        for uid in [u for u in self._evicted if self.state.ledger.pod(u) is None]:
            del self._evicted[uid]
        return set(self._evicted)

    def _busy_nodes(self, uid: str) -> set[str]:
        now = time.monotonic()
        for key, at in list(self._refused.items()):
            if now - at > REFUSED_TTL_S:
                del self._refused[key]
        busy = {n for (who, n) in self._refused if who == uid}
        for other in list(self._reservations):
            held = self._live_reservation(other)
            if held is not None and self._waiting_for(held):
                busy.add(held.node)
        return busy

    # -------------------------------------------------------------- the step
    def _plan(self, pod: Mapping[str, Any], node_names: list[str] | None,
              budgets: list[Budget]) -> PreemptionPlan | None:
        """The preemption that lets ``pod`` fit now with victims, or None (no plan, no
        victims needed, or a malformed request)."""
        infos = {u: pod_priority_info(p, budgets) for u, p in self._victim_pods.items()
                 if self.state.ledger.pod(u) is not None}
        try:
            outcome = plan_preemption(self.state, pod, infos, {b.key: b.allowed for b in budgets},
                                      None if node_names is None else sorted(node_names),
                                      busy_nodes=self._busy_nodes(pod_uid(pod)))
        except (RequestError, FilterError, CodecError):
            return None
        return outcome.plan if outcome.plan is not None and outcome.plan.victims else None

    async def maybe_preempt(self, pod: Mapping[str, Any],
                            node_names: list[str] | None) -> str:
        """After a filter found no node: plan, reserve and start a preemption for
        ``pod``; returns a note for the filter's answer ("" when none was started).
        ``node_names`` None (a body without the nodes kube-scheduler's own filters
        passed) starts none: hami would evict on nodes the pod may never run on."""
        if not self.settings.preemption or not may_preempt(pod) or node_names is None:
            return ""
        priority = pod_priority(pod)
        if not any(pod_priority_info(p).priority < priority
                   for u, p in self._victim_pods.items() if self.state.ledger.pod(u)):
            return ""
        uid = pod_uid(pod)
        if uid in self._reservations:  # another filter of this pod got there first
            return ""
        # Budgets only rank the candidates: whether any preemption helps is known without
        # them, and a pod no preemption helps (one too big for every card, filtered
        # again and again) must not cost a cluster-wide list of budgets each time.
        if self._plan(pod, node_names, []) is None:
            return ""
        try:
            budgets = [Budget.from_object(b) for b in await self.kube.list_pdbs()]
        except KubeError as exc:  # the Eviction API still enforces every budget
            log.warning("PodDisruptionBudgets not read (%s); planning without them",
                        exc.message)
            budgets = []
        if uid in self._reservations:  # another filter of this pod got there first
            return ""
        try:
            waits_for = fits_once_gone(self.state, pod, self._leaving(),
                                       None if node_names is None else sorted(node_names))
        except (RequestError, FilterError, CodecError):
            return ""
        if waits_for is not None:  # room is coming: no more victims than needed
            return f"waiting for evicted pods to leave node {waits_for}"
        plan = self._plan(pod, node_names, budgets)
        if plan is None or not plan.victims:
            return ""
        request = plan.request
        entry = self.state.charge(uid, plan.node, plan.devices, request.n_init,
                                  namespace=request.namespace, name=request.name,
                                  cpu_milli=request.cpu_milli, memory_mib=request.memory_mib,
                                  mig=plan.result.mig,
                                  vendor_devices=plan.result.vendor_devices)
        self._committed_at[uid] = time.monotonic()
        description = plan.describe()
        self._reservations[uid] = Reservation(
            plan.node, frozenset(v.uid for v in plan.victims), entry, time.monotonic(),
            description, {v.uid: (v.namespace, v.name) for v in plan.victims})
        created = rfc3339_ns(_meta(pod).get("creationTimestamp"))
        if created is not None:
            self._preemptors[uid] = created / 1e9
        self._spawn(self._carry_out(_meta(pod), uid, priority, plan))
        return f"preempting on {description}"

    async def _carry_out(self, meta: Mapping[str, Any], uid: str, priority: int,
                         plan: PreemptionPlan) -> None:
        def refused(_: str) -> None:
            self._refused[(uid, plan.node)] = time.monotonic()
            self._drop_reservation(uid)
            self._preemptors.pop(uid, None)

        def evicted(victim: str) -> None:
            self._evicted[victim] = time.monotonic()

        await carry_out(self.kube, self.events, self.observer, meta, uid, priority, plan,
                        evicted=evicted, refused=refused)

    async def preempt_verb(self, args: PreemptArgs) -> JSON:
        """The extender's ``preempt`` verb: kube-scheduler's dry run found ``args.victims``
        per node (it sees no device memory, so for in-tree resources such as replica
        counts only). Per node, hami's own victims replace the pods holding devices among
        them (those that free the right card, :func:`plan_preemption` on that node alone);
        victims hami does not track (no devices) are kept; a node where no preemption
        lets the pod fit is removed. Nothing is evicted here: kube-scheduler evicts.
        With ``--no-preemption`` kube-scheduler's victims come back unchanged."""
        if not self.settings.preemption:
            return preempt_result({n: (v, args.violations.get(n, 0))
                                   for n, v in args.victims.items() if v})
        if await self._ready():
            return preempt_result({})
        try:
            pod = await self.pending.resolve(args.pod, self.kube.get_pod)
        except (UnknownPod, KubeError):
            return preempt_result({})
        try:
            budgets = [Budget.from_object(b) for b in await self.kube.list_pdbs()]
        except KubeError:
            budgets = []
        infos = {u: pod_priority_info(p, budgets) for u, p in self._victim_pods.items()
                 if self.state.ledger.pod(u) is not None}
        allowed = {b.key: b.allowed for b in budgets}
        uid = pod_uid(pod)
        leaving = self._leaving()
        kept: dict[str, tuple[list[str], int]] = {}
        for node, theirs in sorted(args.victims.items()):
            untracked = [v for v in theirs if self.state.ledger.pod(v) is None]
            try:
                if fits_once_gone(self.state, pod, leaving, [node]) is not None:
                    # the slice is coming (pods hami evicted still leave): no GPU victim
                    if untracked:
                        kept[node] = (untracked, args.violations.get(node, 0))
                    continue
                outcome = plan_preemption(self.state, pod, infos, allowed, [node],
                                          busy_nodes=self._busy_nodes(uid))
            except (RequestError, FilterError, CodecError):
                return preempt_result({})
            if outcome.plan is None:
                continue
            ours = [v.uid for v in outcome.plan.victims]
            chosen = ours + [v for v in untracked if v not in ours]
            if chosen:
                extra = args.violations.get(node, 0) if untracked else 0
                kept[node] = (chosen, outcome.plan.violations + extra)
        return preempt_result(kept)

    def preemptor_bound(self, uid: str) -> None:
        """A pod bound: report the time from its creation when it preempted."""
        created = self._preemptors.pop(uid, None)
        if created is not None:
            self.observer.preemptor_bound(max(0.0, time.time() - created))


__all__ = ["PREEMPTED", "PREEMPTING", "PREEMPTION_REFUSED", "REFUSED_TTL_S",
           "RESERVATION_TTL_S", "PreemptFlow", "Reservation"]
