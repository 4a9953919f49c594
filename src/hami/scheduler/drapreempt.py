"""Preemption in DRA mode (``hami scheduler --dra-mode``, on unless ``--no-preemption``).

In DRA mode kube-scheduler allocates the claims and hami answers only ``/prioritize``
and the webhook, so no hami verb sees a pod that fits nowhere. kube-scheduler's own
preemption cannot free device capacity either: its dry run removes lower-priority pods
and runs the Filter plugins again, but the DynamicResources plugin has no
PreFilterExtensions (Kubernetes v1.37), so a victim's claim still holds its device in
that dry run and no node is found ("expected at least one victim pod").

:class:`DraPreemption` is a loop of the leader that does it instead, with extender
mode's core (:func:`hami.core.preemption.plan_preemption`):

* **who**: pods of the pod watch with claims, not bound, whose ``PodScheduled``
  condition is ``False`` with reason ``Unschedulable``, whose ``preemptionPolicy`` is not
  ``Never`` and whose claims ask hami's cards and are not allocated yet; most important
  first (priority, then creation);
* **the input**: the watched ResourceSlices and ResourceClaims as the core's ledger
  (:func:`hami.dra.preemptstate.dra_cluster`: cards, and each allocated claim charged to
  the pod that owns it), the preemptor's request read from its claims
  (:func:`~hami.dra.preemptstate.preemptor_pod`), the nodes its nodeSelector, required
  node affinity, taints and cordons allow (:func:`~hami.dra.preemptstate.node_admits`),
  each charged pod's
  priority and the PodDisruptionBudgets covering it;
* **carried out** by :func:`hami.scheduler.evictions.carry_out`, as in extender mode:
  ``status.nominatedNodeName``, the Eviction API (a refused eviction drops the plan and
  that node for this pod for :data:`REFUSED_TTL_S`: another node or a wait, with a
  ``PreemptionRefused`` Event saying why), ``Preempted``/``Preempting`` Events and the
  metrics; the resourceclaim controller then deallocates the victims' claims and
  kube-scheduler retries the preemptor;
* **a reservation** per preemption until the preemptor is bound (at most
  :data:`RESERVATION_TTL_S`): the preemptor's slice is charged above the victims' in
  every later round, so no other preemptor plans over the same freed slice, and its
  node takes no second preemption while victims still hold claims there; ``/prioritize``
  (:meth:`steer`) scores the reserved node 0 for every other pod and the top score
  for the preemptor. DRA offers nothing stronger to a party that is not the allocator
  (module docs of :mod:`hami.dra.prioritize`; docs/priority-preemption.md): a
  nominated pod's claims are not counted for other pods, and a claim's tolerations
  cannot be added after it is made;
* **no more victims than needed**: a pod that fits once the pods hami already evicted
  have left waits for them instead of evicting more.

Everything is rebuilt from the watched objects each round (at most every
:data:`INTERVAL_S` while some pod waits, and only when a pod, slice, claim or node
changed since a round that started nothing, or :data:`RECHECK_S` passed), so a restart or a new leader loses nothing
but the reservations, which the next rounds make again from the pods' state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hami.core.codec import CodecError
from hami.core.filter import FilterError
from hami.core.model import PodSingleDevice
from hami.core.podobjects import meta_of, pod_uid
from hami.core.podpriority import Budget, may_preempt, pod_priority, pod_priority_info, rfc3339_ns
from hami.core.preemption import PreemptionPlan, fits_once_gone, plan_preemption
from hami.core.request import RequestError
from hami.dra.cache import DraObjects
from hami.dra.fragscore import MAX_PRIORITY
from hami.dra.hosts import HostUsage
from hami.dra.preemptstate import (
    DraCluster,
    dra_cluster,
    grant_fits,
    node_admits,
    preemptor_pod,
)
from hami.kube import KubeError
from hami.scheduler.evictions import carry_out

log = logging.getLogger("hami.scheduler.preemption")

JSON = dict[str, Any]
#: A reservation whose preemptor is not bound after this long is released.
RESERVATION_TTL_S = 300.0
#: A node where an eviction for a pod was refused is not tried again for it this long.
REFUSED_TTL_S = 60.0
#: Seconds between rounds while some pod waits (a pod event starts one at once).
INTERVAL_S = 2.0
#: A round that would see what the last fruitless one saw is skipped, except once in
#: this many seconds (a node's taints or cordon may have changed).
RECHECK_S = 30.0


@dataclass(slots=True)
class DraReservation:
    """A preemption in flight: the preemptor (``namespace``/``name``) goes to ``node``
    on ``devices`` (the plan's grant) once ``victims`` (uids) have left."""

    node: str
    devices: PodSingleDevice
    victims: frozenset[str]
    since: float
    namespace: str
    name: str


def unschedulable(pod: Mapping[str, Any]) -> bool:
    """Not bound, not being deleted, and ``PodScheduled`` is ``False`` with reason
    ``Unschedulable`` (kube-scheduler found no node)."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    if (spec or {}).get("nodeName") or meta_of(pod).get("deletionTimestamp"):
        return False
    status = pod.get("status") if isinstance(pod.get("status"), Mapping) else {}
    for cond in (status or {}).get("conditions") or []:
        if (isinstance(cond, Mapping) and cond.get("type") == "PodScheduled"
                and cond.get("status") == "False" and cond.get("reason") == "Unschedulable"):
            return True
    return False


class DraPreemption:
    """The DRA-mode preemption loop (module docstring) of ``engine``
    (:class:`hami.scheduler.engine.Engine`: its settings, config, Kubernetes client,
    Node cache, Events, observer and leadership) over ``objects`` (the watched slices
    and claims) and ``hosts`` (the nodes' CPU and memory, fed by the same pod watch;
    None: not checked). Feed it the pod watch (:meth:`observe`, :meth:`relisted`); :meth:`start`
    runs the loop on the running event loop."""

    def __init__(self, engine: Any, objects: DraObjects, hosts: HostUsage | None = None
                 ) -> None:
        self.engine = engine
        self.objects = objects
        self.hosts = hosts
        #: Pods with claims, not terminating: uid -> pod.
        self._pods: dict[str, JSON] = {}
        #: Unschedulable pods that may preempt: uid -> pod.
        self._waiting: dict[str, JSON] = {}
        self._reservations: dict[str, DraReservation] = {}
        self._refused: dict[tuple[str, str], float] = {}
        #: Pods hami evicted (uid) -> when (monotonic s); kept while their claims hold.
        self._evicted: dict[str, float] = {}
        #: Preemptors (uid) -> creation (Unix s), for the time-to-bound metric.
        self._created: dict[str, float] = {}
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Rounds run and preemptions started, for tests and logs.
        self.rounds = 0
        self.started = 0
        #: Bumped at each pod event that matters here; with the objects' version and the
        #: books' sizes it tells whether a round could decide anything new.
        self._seq = 0
        self._last: tuple[Any, ...] | None = None

    # ----------------------------------------------------------------- pod feed
    def observe(self, pod: Mapping[str, Any], deleted: bool) -> None:
        """A pod event of the engine's watch (never raises)."""
        uid = pod_uid(pod)
        spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
        claims = (spec or {}).get("resourceClaims")
        if claims or uid in self._pods:
            self._seq += 1
        if deleted or meta_of(pod).get("deletionTimestamp") or not claims:
            self._pods.pop(uid, None)
            self._waiting.pop(uid, None)
            if deleted:
                self._reservations.pop(uid, None)
                self._created.pop(uid, None)
            return
        self._pods[uid] = dict(pod)
        if (spec or {}).get("nodeName"):
            self._waiting.pop(uid, None)
            if self._reservations.pop(uid, None) is not None or uid in self._created:
                created = self._created.pop(uid, None)
                if created is not None:
                    self.engine.observer.preemptor_bound(max(0.0, time.time() - created))
            return
        if unschedulable(pod) and may_preempt(pod):
            self._waiting[uid] = self._pods[uid]
            self._kick.set()
        else:
            self._waiting.pop(uid, None)

    def relisted(self, listed: set[Any]) -> None:
        """A relist of pods: those not listed are gone."""
        for uid in [u for u in self._pods if u not in listed]:
            self.observe({"metadata": {"uid": uid}}, True)

    # ------------------------------------------------------------------ steering
    def steer(self, pod: Mapping[str, Any], scores: list[JSON]) -> list[JSON]:
        """``/prioritize``'s scores for ``pod`` with the live reservations applied: a
        node reserved for another preemptor scores 0, the preemptor's own node the top."""
        self._expire()
        if not self._reservations:
            return scores
        uid = pod_uid(pod)
        own = self._reservations.get(uid)
        others = {r.node for u, r in self._reservations.items() if u != uid}
        out = []
        for entry in scores:
            host = entry.get("host")
            if own is not None and host == own.node:
                entry = {**entry, "score": MAX_PRIORITY}
            elif host in others:
                entry = {**entry, "score": 0}
            out.append(entry)
        return out

    # ---------------------------------------------------------------------- loop
    def start(self) -> None:
        """Run the loop (no-op when running)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="dra-preemption")
            background = getattr(self.engine, "_background", None)
            if isinstance(background, set):  # cancelled with the engine's tasks
                background.add(self._task)
                self._task.add_done_callback(background.discard)

    async def stop(self) -> None:
        """Stop the loop."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), INTERVAL_S)
            self._kick.clear()
            try:
                await self.round()
            except Exception:  # noqa: BLE001 - one bad round must not end the loop
                log.exception("DRA preemption round failed")

    def _ready(self) -> bool:
        e = self.engine
        return bool(e.settings.preemption and e.leader and e.synced.is_set()
                    and all(ev.is_set() for ev in self.objects.synced.values()))

    def _expire(self) -> None:
        now = time.monotonic()
        for uid in [u for u, r in self._reservations.items()
                    if now - r.since > RESERVATION_TTL_S]:
            del self._reservations[uid]
        for key in [k for k, at in self._refused.items() if now - at > REFUSED_TTL_S]:
            del self._refused[key]

    def view(self) -> DraCluster:
        """The core's view of the cluster now, with every live reservation charged on its
        node (above its victims, until they leave and its own claims are allocated)."""
        if self.hosts is not None:
            self.hosts.refresh()
        view = dra_cluster(self.engine.config, self.objects.slices.values(),
                           self.objects.claims, self._pods, self.hosts)
        for uid, r in list(self._reservations.items()):
            if view.state.ledger.pod(uid) is not None or not view.state.ledger.node(r.node):
                continue
            if (not any(view.state.ledger.pod(v) is not None for v in r.victims)
                    and not grant_fits(view.state, r.node, r.devices)):
                # the victims have left and another pod took the room: holding it would
                # keep the preemptor out of every round until the reservation expires
                log.info("DRA preemption for %s/%s: the room freed on %s was taken; "
                         "it may preempt again", r.namespace, r.name, r.node)
                del self._reservations[uid]
                continue
            view.state.charge(uid, r.node, r.devices, 0, namespace=r.namespace,
                              name=r.name)
        for uid in [u for u in self._evicted if view.state.ledger.pod(u) is None]:
            del self._evicted[uid]
        return view

    def _busy(self, uid: str, view: DraCluster) -> set[str]:
        busy = {n for (who, n) in self._refused if who == uid}
        for r in self._reservations.values():
            if any(view.state.ledger.pod(v) is not None for v in r.victims):
                busy.add(r.node)
        return busy

    async def round(self) -> int:
        """One pass over the waiting pods; returns how many preemptions it started."""
        if not self._ready():
            return 0
        self._expire()
        waiting = sorted(self._waiting.values(), key=lambda p: (
            -pod_priority(p), rfc3339_ns(meta_of(p).get("creationTimestamp")) or 0))
        if not waiting:
            return 0
        # nothing changed since a round that started nothing: it would decide the same
        now = (self._seq, getattr(self.objects, "version", None), len(self._reservations),
               len(self._refused), len(self._evicted), int(time.monotonic() // RECHECK_S))
        if now == self._last:
            return 0
        self.rounds += 1
        # the view first: it releases a reservation whose freed room another pod took,
        # and that preemptor is then among the waiting again
        view = self.view()
        waiting = [p for p in waiting if pod_uid(p) not in self._reservations]
        budgets: list[Budget] | None = None
        started = 0
        for pod in waiting:
            plan = self._plan(pod, view, budgets or [])
            if plan is None:
                continue
            if budgets is None:  # only now: budgets rank candidates, they never enable one
                try:
                    budgets = [Budget.from_object(b) for b in await self.engine.kube.list_pdbs()]
                except KubeError as exc:  # the Eviction API still enforces every budget
                    log.warning("PodDisruptionBudgets not read (%s); planning without them",
                                exc.message)
                    budgets = []
                plan = self._plan(pod, view, budgets)
                if plan is None:
                    continue
            self._reserve(pod, plan, view)
            started += 1
        self._last = None if started else now
        return started

    def _plan(self, pod: JSON, view: DraCluster, budgets: list[Budget]
              ) -> PreemptionPlan | None:
        uid = pod_uid(pod)
        synth = preemptor_pod(pod, self.objects.claims, self.engine.config)
        if synth is None:
            return None
        nodes = [n for n in view.state.ledger.node_names()
                 if (node := self.engine.nodes.get(n)) is not None and not node_admits(pod, node)]
        infos = {u: pod_priority_info(self._pods[u], budgets) for u in view.pods
                 if u in self._pods and u != uid}
        # leaving: the pods hami evicted and those a live plan is evicting now (its
        # evictions run in the background, so a plan of this same round counts too)
        planned = {v for r in self._reservations.values() for v in r.victims}
        leaving = {u for u in (*self._evicted, *planned) if view.state.ledger.pod(u) is not None}
        try:
            if fits_once_gone(view.state, synth, leaving, nodes) is not None:
                return None  # room is coming: no more victims than needed
            outcome = plan_preemption(view.state, synth, infos,
                                      {b.key: b.allowed for b in budgets}, nodes,
                                      busy_nodes=self._busy(uid, view))
        except (RequestError, FilterError, CodecError) as exc:
            log.info("no DRA preemption for %s: %s", uid, exc)
            return None
        plan = outcome.plan
        return plan if plan is not None and plan.victims else None

    def _reserve(self, pod: JSON, plan: PreemptionPlan, view: DraCluster) -> None:
        uid = pod_uid(pod)
        meta = meta_of(pod)
        ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
        view.state.charge(uid, plan.node, plan.devices, 0, namespace=ns, name=name)
        self._reservations[uid] = DraReservation(
            plan.node, plan.devices, frozenset(v.uid for v in plan.victims),
            time.monotonic(), ns, name)
        created = rfc3339_ns(meta.get("creationTimestamp"))
        if created is not None:
            self._created[uid] = created / 1e9
        self.started += 1

        def refused(_: str) -> None:
            self._refused[(uid, plan.node)] = time.monotonic()
            self._reservations.pop(uid, None)
            self._created.pop(uid, None)

        def evicted(victim: str) -> None:
            self._evicted[victim] = time.monotonic()

        self.engine._spawn(carry_out(
            self.engine.kube, self.engine.events, self.engine.observer, meta, uid,
            pod_priority(pod), plan, evicted=evicted, refused=refused, mode=" (DRA mode)"))


__all__ = ["INTERVAL_S", "REFUSED_TTL_S", "RESERVATION_TTL_S", "DraPreemption",
           "DraReservation", "unschedulable"]
