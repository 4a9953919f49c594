"""The scheduler's state owner: caches fed by watches, and the filter/bind/admit decisions.

Everything here runs on one asyncio event loop, and every change to the
:class:`~hami.core.state.ClusterState` happens in synchronous code between two awaits,
so there are no threads and no locks around the ledger. A filter decides and charges
the ledger in one synchronous step before it awaits the pod patch; a failed patch undoes
the charge.

Membership rules (HAMi v2.10) are the core's (:meth:`ClusterState.upsert_pod`); this
shell only decides *when* to apply them:

* a pod event without ``hami.io/vgpu-node`` that is not terminal is ignored (HAMi's
  informer does the same), so an older event racing our own patch never drops a charge;
* DELETED releases; a relist (start, watch error, leadership gained) re-applies every
  listed object and releases pods, nodes and quotas that are gone, except charges made
  by a filter after the list was taken.

Vendors (the registry of the device config, HAMi v2.10): registration checks every
vendor's handshake on its own key and registers the devices of the healthy ones, the
pod informer charges every vendor's allocated annotation (the core decodes them),
``/filter`` writes every vendor's annotations, ``/bind`` takes the node lock of every
vendor a regular container uses, in CommonWord order (the generic ``hami.io/mutex.lock``
once, Cambricon's ``cambricon.com/dsmlu.lock`` besides), and the webhook mutates and
pre-checks quota through every vendor.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from hami.api import names
from hami.core.state import TERMINAL_PHASES, ClusterState, pod_uid
from hami.keyring import KeyRing
from hami.kube import KubeError, WatchIdle
from hami.scheduler import decisionlog
from hami.scheduler.binder import NodeLocks
from hami.scheduler.bindflow import BindFlow
from hami.scheduler.events import EventSink
from hami.scheduler.filterflow import (
    PENDING_PATCH_TTL_S,
    DeferredAllocation,
    FilterFlow,
    failure_tokens,
)
from hami.scheduler.nodequeue import InFlight, NodeWaiters
from hami.scheduler.nodes import NodeRegistry
from hami.scheduler.podcache import PendingPods
from hami.scheduler.ports import KubeApi, NoObserver, Observer
from hami.scheduler.preemptflow import PreemptFlow
from hami.scheduler.settings import SchedulerSettings
from hami.webhook.review import review

log = logging.getLogger("hami.scheduler")

JSON = dict[str, Any]
KINDS = ("Node", "ResourceQuota", "Pod")
__all__ = ["KINDS", "PENDING_PATCH_TTL_S", "Counters", "Engine", "failure_tokens"]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _review_pod(body: bytes) -> tuple[str, str]:
    """Namespace and name (or generateName) of an AdmissionReview's pod, for the log of
    a denial; ``("", "")`` when the body says neither."""
    import json

    try:
        request = json.loads(body).get("request") or {}
        meta = (request.get("object") or {}).get("metadata") or {}
        return (str(request.get("namespace") or meta.get("namespace") or ""),
                str(meta.get("name") or meta.get("generateName") or ""))
    except (ValueError, AttributeError, TypeError, RecursionError):
        return "", ""


def _list_key(kind: str, obj: Mapping[str, Any]) -> Any:
    if kind == "Pod":
        return pod_uid(obj)
    if kind == "ResourceQuota":
        return _quota_key(obj)
    return str(_meta(obj).get("name") or "")


def _quota_key(quota: Mapping[str, Any]) -> tuple[str, str]:
    meta = _meta(quota)
    return str(meta.get("namespace") or "default"), str(meta.get("name"))


@dataclass
class Counters:
    """Plain counters for tests, logs and metrics."""

    filters: int = 0
    binds: int = 0
    relists: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    watch_errors: int = 0
    #: Watches restarted from their last resourceVersion after their idle deadline.
    watch_idle_restarts: int = 0
    patch_failures: int = 0
    apply_errors: int = 0
    #: /filter and /bind requests refused because they named a pod hami may not place.
    unknown_pods: int = 0
    #: /filter, /bind and /status requests refused because the peer was not loopback.
    remote_refused: int = 0


class Engine(NodeRegistry, FilterFlow, BindFlow, PreemptFlow):
    """Caches, decisions and their side effects for one scheduler replica."""

    def __init__(self, settings: SchedulerSettings, kube: KubeApi, *,
                 observer: Observer | None = None,
                 local_now: Callable[[], datetime] = datetime.now) -> None:
        self.settings = settings
        self.config = settings.scheduler_config()
        self.kube = kube
        self.state = ClusterState(self.config)
        self.observer = observer or NoObserver()
        self.local_now = local_now
        self.synced = asyncio.Event()
        self.leader = not settings.leader_elect
        #: Whether the API server copies a Binding's labels onto the pod (1.35+; set at
        #: start-up from :mod:`hami.clusterprobe`); False: the bind patches the label.
        self.binding_copies_labels = True
        self.counters = Counters()
        self.nodes: dict[str, JSON] = {}
        self.node_reasons: dict[str, str] = {}
        self._reported: dict[str, int] = {}
        #: Binds waiting for a node's lock, woken one per node change.
        self.waiters = NodeWaiters()
        #: Pods placed by /filter whose /bind has not finished (busy nodes, see _filter).
        self.inflight = InFlight(settings.node_lock_retry_timeout.total_seconds() + 30.0)
        self._committed_at: dict[str, float] = {}
        self._quotas: set[tuple[str, str]] = set()
        self._pending_patch: dict[str, asyncio.Future[str]] = {}
        #: Pods whose filter patch (written by this process) carried bind-phase/bind-time.
        self._phase_written: set[str] = set()
        #: Allocations of pods filtered onto lock-free nodes, written by /bind with the
        #: Binding (FilterFlow.DeferredAllocation).
        self._deferred: dict[str, DeferredAllocation] = {}
        #: Pods waiting for hami: /filter decides on these, never on the request body.
        self.pending = PendingPods(settings.scheduler_name)
        #: Called with every pod event the watch or a relist brings (pod, deleted), after
        #: the caches took it (DRA mode's template reconciler); must not raise.
        self.pod_observers: list[Callable[[Mapping[str, Any], bool], None]] = []
        #: Called after each relist of pods with the UIDs listed (a pod deleted while the
        #: watch was down brings no event); must not raise.
        self.pod_relist_observers: list[Callable[[set[Any]], None]] = []
        #: Signs every allocation /filter writes (device plugins verify it); None: unsigned.
        self.keyring = KeyRing(settings.allocation_key_dir) if settings.allocation_key_dir else None
        self._resource_version: dict[str, str] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self.events = EventSink(kube, settings.scheduler_name, enabled=settings.events)
        self.locks = NodeLocks(kube, timeout=settings.node_lock_timeout,
                               retry_timeout=settings.node_lock_retry_timeout,
                               waiters=self.waiters, cached=self.nodes.get,
                               owner_live=self._owner_live)
        #: Vendors' own node locks by annotation key (Cambricon; value: RFC3339 alone).
        self.vendor_locks: dict[str, NodeLocks] = {}
        for vendor in self.state.vendors.values():
            key = vendor.lock_annotation
            if key and key not in self.vendor_locks:
                self.vendor_locks[key] = NodeLocks(
                    kube, timeout=settings.node_lock_timeout,
                    retry_timeout=settings.node_lock_retry_timeout,
                    waiters=self.waiters, cached=self.nodes.get,
                    annotation=key, owner_in_value=False)
        self._lock_keys = frozenset({names.NODE_LOCK, *self.vendor_locks})
        #: (node, lock annotation) pairs the node watch shows set.
        self._locked: set[tuple[str, str]] = set()
        #: Last allocatable count per (node, CommonWord) of the other vendors (HAMi v2.10).
        self._vendor_reported: dict[tuple[str, str], int] = {}
        #: Per node: the cached Node object its devices were last registered from, the
        #: vendors read and the reason returned (see NodeRegistry.register).
        self._registered: dict[str, tuple[JSON, frozenset[str] | None, str]] = {}
        #: Preemption's reservations, refused nodes and candidate pods (PreemptFlow).
        self._init_preemption()

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Initial list of nodes, quotas and pods (the ledger is rebuilt from pod
        annotations before any filter is answered), then the watches and the register
        ticker."""
        self.events.start()
        await self.resync()
        gc.collect()
        gc.freeze()  # 40k cached pods: no full-GC pauses inside filter afterwards
        self.synced.set()
        for kind in KINDS:
            self._tasks.append(asyncio.create_task(self._watch(kind), name=f"watch-{kind}"))
        self._tasks.append(asyncio.create_task(self._register_ticker(), name="register"))

    async def stop(self) -> None:
        for task in [*self._tasks, *self._background]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._background, return_exceptions=True)
        self._tasks.clear()
        await self.events.stop()

    async def resync(self, kinds: tuple[str, ...] = KINDS) -> None:
        """List ``kinds`` (streamed: each object is applied as it arrives) and reconcile
        the caches with the lists (what was not listed is gone)."""
        for kind in kinds:
            listed_at = time.monotonic()
            seen: set[Any] = set()

            def on_item(obj: JSON, kind: str = kind, seen: set[Any] = seen) -> None:
                seen.add(_list_key(kind, obj))
                self.apply(kind, "ADDED", obj)

            self._resource_version[kind] = await self.kube.list(kind, on_item)
            self._forget_unlisted(kind, seen, listed_at)
            self.counters.relists[kind] += 1

    async def set_leader(self, leader: bool) -> None:
        """Leadership changed. A new leader relists before it decides anything."""
        if leader and not self.leader:
            await self.resync()
            self.leader = True
            self.register_all()
        elif not leader:
            self.leader = False
        if self.settings.pod_name and self.settings.pod_namespace:
            self._spawn(self._label_self("leader" if leader else "follower"))

    async def _label_self(self, role: str) -> None:
        """``hami.io/scheduler-role`` on this replica's own pod (a Service can select the
        leader by it)."""
        try:
            await self.kube.patch_pod(self.settings.pod_namespace, self.settings.pod_name,
                                      {"metadata": {"labels": {"hami.io/scheduler-role": role}}})
        except KubeError as exc:
            log.info("scheduler-role label not written: %s", exc)

    # ------------------------------------------------------------- watches
    async def _watch(self, kind: str) -> None:
        delay = 0.2
        while True:
            try:
                async for event_type, obj in self.kube.watch(kind, self._resource_version[kind]):
                    rv = _meta(obj).get("resourceVersion")
                    if rv:
                        self._resource_version[kind] = str(rv)
                    if event_type != "BOOKMARK":
                        self.apply(kind, event_type, obj)
                    delay = 0.2
                continue  # the server closed the watch normally: resume from the last version
            except asyncio.CancelledError:
                raise
            except WatchIdle as exc:
                # Silent connection (no event, no bookmark): a new watch from the last
                # version sees what happened meanwhile; a 410 on it relists below.
                self.counters.watch_idle_restarts += 1
                log.info("watch %s: %s; restarting from resourceVersion %s", kind, exc,
                            self._resource_version[kind])
                continue
            except Exception as exc:
                self.counters.watch_errors += 1
                log.warning("watch %s: %s; relisting", kind, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
            try:
                await self.resync((kind,))
            except Exception as exc:
                log.warning("relist %s failed: %s", kind, exc)

    def apply(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED, DELETED). A malformed object is logged and
        skipped: it must never stop the watch or the relist of everything else."""
        try:
            self._apply(kind, event_type, obj)
        except Exception:
            self.counters.apply_errors += 1
            log.exception("cannot apply %s %s %s", event_type, kind, _meta(obj).get("name"))

    def _apply(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        deleted = event_type == "DELETED"
        if kind == "Pod":
            self._apply_pod(obj, deleted)
        elif kind == "Node":
            self._apply_node(obj, deleted)
        elif kind == "ResourceQuota":
            if deleted:
                self.state.remove_quota(obj)
                self._quotas.discard(_quota_key(obj))
            else:
                self.state.upsert_quota(obj)
                self._quotas.add(_quota_key(obj))

    def _forget_unlisted(self, kind: str, listed: set[Any], listed_at: float) -> None:
        if kind == "Node":
            for name in list(self.nodes):
                if name not in listed:
                    self._apply_node({"metadata": {"name": name}}, True)
        elif kind == "ResourceQuota":
            for ns, qname in list(self._quotas - listed):
                self.apply(kind, "DELETED", {"metadata": {"namespace": ns, "name": qname}})
        elif kind == "Pod":
            self.pending.forget_unlisted(listed)
            for relisted in self.pod_relist_observers:
                relisted(listed)
            self.forget_unlisted_victims(listed)
            for entry in list(self.state.ledger.pods()):
                if entry.uid not in listed and self._committed_at.get(entry.uid, -1.0) < listed_at:
                    self.state.remove_pod(entry.uid)
                    self._committed_at.pop(entry.uid, None)
                    self._deferred.pop(entry.uid, None)

    def _apply_pod(self, pod: Mapping[str, Any], deleted: bool) -> None:
        self._apply_pod_caches(pod, deleted)
        for observe in self.pod_observers:
            observe(pod, deleted)

    def _apply_pod_caches(self, pod: Mapping[str, Any], deleted: bool) -> None:
        uid = pod_uid(pod)
        self.pending.apply(pod, deleted)
        self.track_victim(pod, deleted)
        if deleted:
            self.state.remove_pod(uid)
            self._committed_at.pop(uid, None)
            self._pending_patch.pop(uid, None)
            self._phase_written.discard(uid)
            self._deferred.pop(uid, None)
            self.inflight.done(uid)
            return
        annotations = _meta(pod).get("annotations") or {}
        phase = (pod.get("status") or {}).get("phase")
        if annotations.get(names.VGPU_NODE) or phase in TERMINAL_PHASES:
            self.state.upsert_pod(pod)

    # ------------------------------------------------------------- webhook
    def admit(self, body: bytes) -> JSON:
        """``/webhook``: AdmissionReview -> AdmissionReview (HAMi v2.10), every vendor; a
        denial is logged (:func:`decisionlog.admission_denied`)."""
        reply = review(body, self.config, self.state.quota, self.state.vendor_quota)
        response = reply.get("response") or {}
        if response.get("allowed") is False:
            status = response.get("status") or {}
            namespace, name = _review_pod(body)
            decisionlog.admission_denied(namespace, name, int(status.get("code") or 0),
                                         str(status.get("message") or ""))
        return reply

    # -------------------------------------------------------------- status
    def ready(self) -> bool:
        return self.synced.is_set() and self.leader

    def snapshot(self) -> dict[str, Any]:
        """A summary for logs and tests."""
        return {"nodes": len(self.state.ledger.node_names()),
                "pods": sum(1 for _ in self.state.ledger.pods()),
                "leader": self.leader, "synced": self.synced.is_set(),
                "events_dropped": self.events.dropped,
                "lock_takeovers": self.locks.takeovers,
                "counters": self.counters.__dict__,
                "now": datetime.now(UTC).isoformat()}
