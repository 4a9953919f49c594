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
import functools
import gc
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from hami.api import names
from hami.core.codec import CodecError, parse_scoring_weights
from hami.core.filter import FilterError
from hami.core.provenance import SIGNATURE, sign
from hami.core.request import RequestError
from hami.core.state import TERMINAL_PHASES, ClusterState, pod_uid
from hami.extender.wire import BindArgs, FilterArgs, filter_result
from hami.keyring import KeyRing
from hami.kube import KubeError, WatchIdle
from hami.scheduler import decisionlog
from hami.scheduler.binder import LockError, NodeLocks, acquire_all
from hami.scheduler.events import (
    BINDING_FAILED,
    BINDING_SUCCEED,
    FILTERING_FAILED,
    FILTERING_SUCCEED,
    UNKNOWN_SCHEDULER_POLICY,
    EventSink,
)
from hami.scheduler.nodequeue import InFlight, NodeWaiters
from hami.scheduler.podcache import PendingPods, UnknownPod
from hami.scheduler.registration import check_node
from hami.scheduler.settings import SchedulerSettings
from hami.webhook.review import review

log = logging.getLogger("hami.scheduler")

JSON = dict[str, Any]
KINDS = ("Node", "ResourceQuota", "Pod")
#: A failed filter patch is reported by the pod's bind within this time, then forgotten.
PENDING_PATCH_TTL_S = 600.0


class KubeApi(Protocol):
    """What the engine needs from :class:`hami.kube.Kube` (a fake implements it in tests)."""

    async def list(self, kind: str, on_item: Callable[[JSON], None]) -> str: ...
    def watch(self, kind: str, resource_version: str) -> Any: ...
    async def get_node(self, name: str) -> JSON: ...
    async def get_pod(self, namespace: str, name: str) -> JSON | None: ...
    async def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> JSON: ...
    async def patch_node(self, name: str, patch: Mapping[str, Any]) -> JSON: ...
    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None: ...
    async def create_event(self, event: Mapping[str, Any]) -> None: ...


class Observer(Protocol):
    """Metrics hooks (see :mod:`hami.scheduler.metrics`)."""

    def filter_done(self, seconds: float, outcome: str) -> None: ...
    def bind_done(self, seconds: float, outcome: str) -> None: ...


class _NoObserver:
    def filter_done(self, seconds: float, outcome: str) -> None:
        pass

    def bind_done(self, seconds: float, outcome: str) -> None:
        pass


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


def _ordered(node_names: list[str] | None) -> list[str] | None:
    """Candidate names sorted: kube-scheduler rotates its node list every cycle, and the
    core breaks score ties by input order, so sorting makes the choice reproducible (the
    offline ``hami schedule`` gives the same answer for nodes listed by name)."""
    return None if node_names is None else sorted(node_names)


_TOKEN = re.compile(r"^(\d+)/(\d+) (\S+)$")


def failure_tokens(failed: Mapping[str, str]) -> dict[str, list[str]]:
    """Nodes per failure token, from GenReason strings (``"1/4 CardInsufficientMemory, ..."``);
    only items of the form ``<n>/<m> <Token>`` count, as in HAMi."""
    out: dict[str, list[str]] = {}
    for node, reason in failed.items():
        for item in reason.split(", "):
            match = _TOKEN.match(item.strip())
            if match:
                out.setdefault(match.group(3), []).append(node)
    return out


def _list_key(kind: str, obj: Mapping[str, Any]) -> Any:
    if kind == "Pod":
        return pod_uid(obj)
    if kind == "ResourceQuota":
        return _quota_key(obj)
    return str(_meta(obj).get("name") or "")


def _registration_view(node: Mapping[str, Any],
                       locks: frozenset[str] = frozenset({names.NODE_LOCK})) -> Any:
    """What registration reads from a node: everything but the node lock annotations."""
    meta = node["metadata"]
    ann = {k: v for k, v in meta["annotations"].items() if k not in locks}
    status = node["status"]
    return ann, meta["labels"], status["allocatable"], status.get("capacity")


def _quota_key(quota: Mapping[str, Any]) -> tuple[str, str]:
    meta = _meta(quota)
    return str(meta.get("namespace") or "default"), str(meta.get("name"))


def _slim_node(node: Mapping[str, Any]) -> JSON:
    """What the engine keeps of a Node: name, version, labels, annotations, allocatable
    and capacity (vendors such as Cambricon synthesise devices from capacity, HAMi v2.10)."""
    meta = _meta(node)
    status = node.get("status") or {}
    return {"metadata": {"name": meta.get("name"), "resourceVersion": meta.get("resourceVersion"),
                         "labels": dict(meta.get("labels") or {}),
                         "annotations": dict(meta.get("annotations") or {})},
            "status": {"allocatable": dict(status.get("allocatable") or {}),
                       "capacity": dict(status.get("capacity") or {})}}


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


class Engine:
    """Caches, decisions and their side effects for one scheduler replica."""

    def __init__(self, settings: SchedulerSettings, kube: KubeApi, *,
                 observer: Observer | None = None,
                 local_now: Callable[[], datetime] = datetime.now) -> None:
        self.settings = settings
        self.config = settings.scheduler_config()
        self.kube = kube
        self.state = ClusterState(self.config)
        self.observer = observer or _NoObserver()
        self.local_now = local_now
        self.synced = asyncio.Event()
        self.leader = not settings.leader_elect
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
        #: Pods waiting for hami: /filter decides on these, never on the request body.
        self.pending = PendingPods(settings.scheduler_name)
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
            for entry in list(self.state.ledger.pods()):
                if entry.uid not in listed and self._committed_at.get(entry.uid, -1.0) < listed_at:
                    self.state.remove_pod(entry.uid)
                    self._committed_at.pop(entry.uid, None)

    def _apply_pod(self, pod: Mapping[str, Any], deleted: bool) -> None:
        uid = pod_uid(pod)
        self.pending.apply(pod, deleted)
        if deleted:
            self.state.remove_pod(uid)
            self._committed_at.pop(uid, None)
            self._pending_patch.pop(uid, None)
            self._phase_written.discard(uid)
            self.inflight.done(uid)
            return
        annotations = _meta(pod).get("annotations") or {}
        phase = (pod.get("status") or {}).get("phase")
        if annotations.get(names.VGPU_NODE) or phase in TERMINAL_PHASES:
            self.state.upsert_pod(pod)

    # --------------------------------------------------------------- nodes
    def _selected(self, node: Mapping[str, Any]) -> bool:
        labels = _meta(node).get("labels") or {}
        return all(labels.get(k) == v for k, v in self.settings.node_label_selector.items())

    def _apply_node(self, node: Mapping[str, Any], deleted: bool) -> None:
        name = str(_meta(node).get("name") or "")
        if deleted or not self._selected(node):
            for key, _ in self._all_locks():
                self._locked.discard((name, key))
            self.state.remove_node(name)
            self.nodes.pop(name, None)
            self._reported.pop(name, None)
            self.node_reasons.pop(name, None)
            for word in self.state.vendors:
                self._vendor_reported.pop((name, word), None)
        else:
            slim = _slim_node(node)
            old = self.nodes.get(name)
            self.nodes[name] = slim
            rv = str(slim["metadata"].get("resourceVersion") or "")
            annotations = slim["metadata"]["annotations"]
            for key, locks in self._all_locks():
                locks.seen(name, rv)
                if annotations.get(key):
                    self._locked.add((name, key))
                else:
                    self._locked.discard((name, key))
            if old is None or (_registration_view(old, self._lock_keys)
                               != _registration_view(slim, self._lock_keys)):
                self.register(name)  # not for lock-only changes (two per bind)
        self.waiters.changed(name)

    def register(self, name: str) -> None:
        """Health check and (re)registration of one node (HAMi v2.10), per vendor."""
        node = self.nodes.get(name)
        if node is None:
            return
        now = self.local_now()
        health = check_node(node, self._reported.get(name), now)
        self._reported[name] = health.reported
        handshakes: dict[str, str] = {}
        if health.handshake is not None:
            handshakes[names.NODE_HANDSHAKE] = health.handshake
        if not self.state.vendors:  # NVIDIA only: HAMi's NVIDIA loop, unchanged
            if handshakes and self.leader:
                self._spawn(self._patch_handshake(name, handshakes))
            if not health.healthy:
                self.state.remove_node(name)
                self._node_reason(name, health.reason)
                return
            self._node_reason(name, self.state.upsert_node(node))
            return
        healthy = {names.NVIDIA} if health.healthy else set()
        annotations = _meta(node).get("annotations") or {}
        nvidia_present = names.NODE_REGISTER in annotations or names.NODE_HANDSHAKE in annotations
        reasons = [] if health.healthy or not nvidia_present else [f"NVIDIA: {health.reason}"]
        for word, vendor in self.state.vendors.items():
            key = (name, word)
            resource = vendor.resource_names().count
            vh = check_node(node, self._vendor_reported.get(key), now,
                            handshake_key=vendor.handshake_key, resource=resource)
            self._vendor_reported[key] = vh.reported
            # ours: a vendor's handshake is only written on nodes that show that vendor
            # (its register annotation, its handshake or its resource), not on every node
            present = (vh.reported > 0 or vendor.handshake_key in annotations
                       or bool(vendor.register_key and vendor.register_key in annotations))
            if vh.handshake is not None and present and vendor.handshake_key:
                handshakes[vendor.handshake_key] = vh.handshake
            if vh.healthy:
                healthy.add(word)
            elif present:
                reasons.append(f"{word}: {vh.reason}")
        if handshakes and self.leader:
            self._spawn(self._patch_handshake(name, handshakes))
        if not healthy:
            self.state.remove_node(name)
            self._node_reason(name, "; ".join(reasons))
            return
        why = self.state.upsert_node(node, vendors=healthy)
        skipped = self.state.vendor_reasons.get(name) or {}
        if not why and skipped:  # registered, but some vendor's devices were malformed
            why = "registered without " + "; ".join(skipped[w] for w in sorted(skipped))
        # health reasons of vendors left out are kept even when the node still registers
        self._node_reason(name, "; ".join(r for r in (*reasons, why) if r))

    def _node_reason(self, name: str, why: str) -> None:
        """Remember why a node is (partly) not registered; log each new reason once."""
        if why and self.node_reasons.get(name) != why:
            log.warning("node %s: %s", name, why)
        self.node_reasons[name] = why

    def register_all(self) -> None:
        for name in list(self.nodes):
            self.register(name)

    async def _register_ticker(self) -> None:
        while True:
            await asyncio.sleep(self.settings.register_interval.total_seconds())
            self.register_all()

    async def _patch_handshake(self, name: str, values: Mapping[str, str]) -> None:
        """One merge patch with every vendor's new handshake value."""
        try:
            await self.kube.patch_node(name, {"metadata": {"annotations": dict(values)}})
        except KubeError as exc:
            log.info("handshake on node %s not written: %s", name, exc)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -------------------------------------------------------------- filter
    async def _ready(self, timeout_s: float = 25.0) -> str:
        if not self.synced.is_set():
            try:
                await asyncio.wait_for(self.synced.wait(), timeout_s)
            except TimeoutError:
                return "scheduler caches not synced yet"
        if not self.leader:
            return "this hami scheduler replica is not the leader"
        return ""

    async def filter(self, args: FilterArgs) -> JSON:
        """``/filter``: ExtenderArgs -> ExtenderFilterResult (HAMi v2.10)."""
        started = time.perf_counter()
        outcome = "error"
        try:
            result = await self._filter(args)
            outcome = ("error" if result["Error"] else
                       "unschedulable" if result["FailedNodes"] and not result["NodeNames"]
                       and not result["Nodes"] else "scheduled")
            return result
        finally:
            self.counters.filters += 1
            self.observer.filter_done(time.perf_counter() - started, outcome)

    async def _filter(self, args: FilterArgs) -> JSON:
        if args.nodes is not None:
            return self.simulate(args)
        started = time.perf_counter()
        n = len(args.node_names or ())
        not_ready = await self._ready()
        if not_ready:
            decisionlog.filter_other(_meta(args.pod), "error", not_ready, n)
            return filter_result(error=not_ready)
        try:
            pod = await self.pending.resolve(args.pod, self.kube.get_pod)
        except UnknownPod as exc:
            self.counters.unknown_pods += 1
            decisionlog.filter_other(_meta(args.pod), "error", str(exc), n)
            return filter_result(error=str(exc))
        except KubeError as exc:
            decisionlog.filter_other(_meta(args.pod), "error", exc.message, n)
            return filter_result(error=f"cannot read the pod: {exc.message}")
        meta = _meta(pod)
        weights = (meta.get("annotations") or {}).get(names.DEVICE_SCORING_WEIGHTS)
        try:
            if weights is not None:
                parse_scoring_weights(str(weights))  # before the core drops an earlier charge
            decision = self._decide(pod, _ordered(args.node_names))
        except (RequestError, FilterError, CodecError) as exc:
            self.events.emit(meta, FILTERING_FAILED, str(exc), warning=True)
            decisionlog.filter_other(meta, "error", str(exc), n)
            return filter_result(error=str(exc))
        result = decision.result
        for warning in result.policy_warnings:
            self.events.emit(meta, UNKNOWN_SCHEDULER_POLICY, warning, warning=True)
        if result.passthrough:
            self.pending.filtered(pod_uid(pod))
            decisionlog.filter_other(meta, "passthrough", candidates=n)
            return filter_result(node_names=args.node_names)
        if result.node is None:
            self._unschedulable_events(meta, result.failed_nodes, n)
            decisionlog.filter_unschedulable(meta, result.failed_nodes, n,
                                             time.perf_counter() - started)
            return filter_result(failed=result.failed_nodes)
        uid = pod_uid(pod)
        now_s = str(int(time.time()))
        annotations = {**decision.annotations, names.VGPU_TIME: now_s}
        if self.keyring is not None:
            annotations[SIGNATURE] = sign(self.keyring.signing_key(), uid, result.node,
                                          annotations)
        # The bind's progress marks ride on this patch (HAMi writes them at /bind, one more
        # pod write per pod): device plugins only look at pods bound to their node, and
        # only a bind that holds the node lock writes the Binding.
        annotations.update({names.BIND_PHASE: "allocating", names.BIND_TIME: now_s})
        entry = self.state.commit(pod, decision)
        self._committed_at[uid] = time.monotonic()
        self.inflight.add(uid, result.node)
        self.pending.filtered(uid)
        # The UID makes the patch a precondition: a pod recreated under the same name
        # in between is refused by the API server (the UID is immutable).
        patch = {"metadata": {"uid": uid, "annotations": annotations,
                              "labels": {names.VGPU_NODE: result.node}}}
        decisionlog.filter_placed(meta, result.node, decision.annotations, result.score, n,
                                  time.perf_counter() - started)
        success = (f"find fit node({result.node}), {n - 1} nodes not fit, 1 nodes "
                   f"fit({result.node}:{result.score:.2f})")
        write = self._write_allocation(meta, uid, entry, patch, success,
                                       self._pending_patch.get(uid))
        if self.settings.async_annotation_patch:
            # Answer now; the merge patch is on its way and /bind waits for it (a failed
            # write fails the bind, kube-scheduler then filters the pod again).
            task = asyncio.ensure_future(write)
            self._pending_patch[uid] = task
            task.add_done_callback(functools.partial(self._patch_done, uid))
            return filter_result(node_names=[result.node])
        error = await write
        return filter_result(error=error) if error else filter_result(node_names=[result.node])

    async def _write_allocation(self, meta: Mapping[str, Any], uid: str, entry: Any,
                                patch: Mapping[str, Any], success: str,
                                previous: asyncio.Future[str] | None) -> str:
        """The filter's one merge patch (annotations + label); "" or the error. On failure
        the charge is undone unless a newer filter of the same pod replaced it."""
        if previous is not None:  # an older decision for this pod must not land last
            await asyncio.gather(previous, return_exceptions=True)
        try:
            await self.kube.patch_pod(str(meta.get("namespace") or "default"),
                                      str(meta.get("name") or ""), patch)
        except KubeError as exc:
            if self.state.ledger.pod(uid) is entry:
                self.state.remove_pod(uid)
                self._committed_at.pop(uid, None)
                self.inflight.done(uid)
            self.counters.patch_failures += 1
            message = f"patch pod annotations failed: {exc.message}"
            self.events.emit(meta, FILTERING_FAILED, message, warning=True)
            return message
        self._phase_written.add(uid)
        self.events.emit(meta, FILTERING_SUCCEED, success, warning=False)
        return ""

    def _patch_done(self, uid: str, task: asyncio.Future[str]) -> None:
        """A written patch is forgotten; a failed one stays until the bind (which then
        fails) or the next filter of the pod, or its deletion, consumes it."""
        failed = task.cancelled() or task.exception() is not None or bool(task.result())
        if self._pending_patch.get(uid) is not task:
            return
        if not failed:
            del self._pending_patch[uid]
        else:  # kept for the bind to report, but not for ever (a pod that never binds)
            asyncio.get_running_loop().call_later(
                PENDING_PATCH_TTL_S, self._expire_patch, uid, task)

    def _expire_patch(self, uid: str, task: asyncio.Future[str]) -> None:
        if self._pending_patch.get(uid) is task:
            del self._pending_patch[uid]

    def _unschedulable_events(self, meta: Mapping[str, Any], failed: Mapping[str, str],
                              n: int) -> None:
        """HAMi's FilteringFailed events: one per failure token, then the summary (HAMi v2.10)."""
        for token, nodes in sorted(failure_tokens(failed).items()):
            self.events.emit(meta, FILTERING_FAILED,
                             f"{len(nodes)} nodes {token}({','.join(sorted(nodes))})",
                             warning=True)
        self.events.emit(meta, FILTERING_FAILED, f"no available node, {n} nodes do not meet",
                         warning=True)

    def simulate(self, args: FilterArgs) -> JSON:
        """Full ``Nodes`` in the args: decide on those nodes alone, with zero usage and no
        side effects (HAMi v2.10)."""
        scratch = ClusterState(self.config)
        assert args.nodes is not None
        names_in = []
        for node in args.nodes:
            name = str(_meta(node).get("name") or "")
            names_in.append(name)
            scratch.upsert_node(node)
        try:
            decision = scratch.filter(args.pod, names_in)
        except (RequestError, FilterError, CodecError) as exc:
            return filter_result(error=str(exc))
        result = decision.result
        if result.passthrough:
            return filter_result(nodes=list(args.nodes), nodes_list=True)
        if result.node is None:
            return filter_result(failed=result.failed_nodes)
        best = next(n for n in args.nodes if _meta(n).get("name") == result.node)
        return filter_result(nodes=[best], nodes_list=True, failed=result.failed_nodes)

    # ---------------------------------------------------------------- bind
    async def bind(self, args: BindArgs) -> JSON:
        """``/bind``: node lock, bind-phase, Binding (HAMi v2.10)."""
        started = time.perf_counter()
        error = "error"
        try:
            reply = await self._bind(args)
            error = "error" if reply["Error"] else "bound"
            return reply
        finally:
            self.counters.binds += 1
            self.observer.bind_done(time.perf_counter() - started, error)

    def _bind_refusal(self, args: BindArgs) -> str:
        """Why ``/bind`` must not bind this pod ("" when it may): only a pod with a UID
        (the Binding carries it as a precondition) that this scheduler charged on that
        node, or that this replica's ``/filter`` passed through, is bound."""
        who = f"pod {args.pod_namespace or 'default'}/{args.pod_name}"
        if not args.pod_uid:
            return f"{who}: the bind request carries no pod UID"
        entry = self.state.ledger.pod(args.pod_uid)
        if entry is not None:
            if entry.node != args.node:
                return f"{who} was placed on node {entry.node}, not {args.node}"
            return ""
        if self.pending.was_filtered(args.pod_uid):
            return ""
        return f"{who} with UID {args.pod_uid} was not filtered by this scheduler"

    async def _bind(self, args: BindArgs) -> JSON:
        started = time.perf_counter()
        try:
            reply, lock_wait_s = await self._bind_locked(args)
        finally:
            self.inflight.done(args.pod_uid)  # bound (the node lock shows it) or failed
        decisionlog.bind(args.pod_namespace or "default", args.pod_name, args.node,
                         lock_wait_s, str(reply["Error"]), time.perf_counter() - started)
        return reply

    async def _bind_locked(self, args: BindArgs) -> tuple[JSON, float]:
        """The bind's reply and the seconds it waited for the node lock(s)."""
        not_ready = await self._ready()
        if not_ready:
            return {"Error": not_ready}, 0.0
        ns = args.pod_namespace or "default"
        meta = {"namespace": ns, "name": args.pod_name, "uid": args.pod_uid}
        refusal = self._bind_refusal(args)
        if refusal:
            self.counters.unknown_pods += 1
            return {"Error": refusal}, 0.0
        pending = self._pending_patch.pop(args.pod_uid, None)
        if pending is not None:
            error = (await asyncio.gather(pending, return_exceptions=True))[0]
            if error:
                message = str(error)
                self.events.emit(meta, BINDING_FAILED, message, warning=True)
                return {"Error": message}, 0.0
        entry = self.state.ledger.pod(args.pod_uid)
        held: list[NodeLocks] = []
        lock_started = time.perf_counter()
        lock_wait_s = 0.0
        try:
            held = await acquire_all(self._bind_locks(entry), args.node, ns, args.pod_name)
            lock_wait_s = time.perf_counter() - lock_started
            if entry is not None and args.pod_uid not in self._phase_written:
                # a charge from before a restart: its filter patch may not carry them
                await self.kube.patch_pod(ns, args.pod_name, {"metadata": {
                    "uid": args.pod_uid, "annotations": {
                        names.BIND_PHASE: "allocating", names.BIND_TIME: str(int(time.time()))}}})
            await self.kube.bind(ns, args.pod_name, args.pod_uid, args.node)
        except (LockError, KubeError) as exc:
            message = exc.message if isinstance(exc, KubeError) else str(exc)
            for locks in reversed(held):  # HAMi releases acquired vendors in reverse
                await locks.release(args.node, ns, args.pod_name)
            self.events.emit(meta, BINDING_FAILED, message, warning=True)
            return {"Error": message}, lock_wait_s or time.perf_counter() - lock_started
        self.pending.bound(args.pod_uid)
        self._phase_written.discard(args.pod_uid)
        self.events.emit(meta, BINDING_SUCCEED,
                         f"Successfully binding node [{args.node}] to {ns}/{args.pod_name}",
                         warning=False)
        return {"Error": ""}, lock_wait_s

    def _all_locks(self) -> list[tuple[str, NodeLocks]]:
        return [(names.NODE_LOCK, self.locks), *self.vendor_locks.items()]

    def _owner_live(self, node: str, namespace: str, name: str) -> bool:
        """The lock owner ``namespace/name`` is a pod this scheduler charges on ``node``
        (the pod watch drops charges of deleted and finished pods)."""
        return any(p.namespace == namespace and p.name == name
                   for p in self.state.ledger.pods_on(node))

    def busy_nodes(self) -> set[str]:
        """Nodes with a bind in flight: a pod placed by /filter whose /bind has not
        finished, or a node lock held (as the watch or our own lock write shows it) until
        the device plugin's Allocate releases it."""
        busy = self.inflight.nodes()
        busy.update(node for node, _ in self._locked)
        for _, locks in self._all_locks():
            busy.update(locks.locked_by_write())
        return busy

    def _decide(self, pod: Mapping[str, Any], node_names: list[str] | None) -> Any:
        """The filter's decision; with ``avoid_busy_nodes``, among the candidates without a
        bind in flight first (:meth:`busy_nodes`: a bind there would wait for the node
        lock), on all candidates when none of those fits."""
        now_ns = time.time_ns()
        if self.settings.avoid_busy_nodes and node_names:
            busy = self.busy_nodes()
            free = [n for n in node_names if n not in busy]
            if free and len(free) < len(node_names):
                decision = self.state.filter(pod, free, now_ns=now_ns)
                if decision.result.node is not None:
                    return decision
        return self.state.filter(pod, node_names, now_ns=now_ns)

    def _bind_locks(self, entry: Any) -> list[NodeLocks]:
        """The node locks a bind takes (HAMi v2.10): per vendor that a regular container
        uses, in CommonWord order, the vendor's own lock or the generic one (taken once:
        it is re-entrant for the same pod anyway)."""
        if entry is None:
            return []
        out: list[NodeLocks] = []
        for word in self.state.lock_vendors(entry.uid):
            vendor = self.state.vendors.get(word)
            key = vendor.lock_annotation if vendor is not None else None
            locks = self.vendor_locks.get(key, self.locks) if key else self.locks
            if locks not in out:
                out.append(locks)
        return out

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
