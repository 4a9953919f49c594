"""Watched copies for the node components (lightkube, synchronous): the node's
``(annotations, resourceVersion)`` (:class:`NodeWatch`) and its Pending pods
(:class:`PodWatch`), and lightkube pods as :class:`~hami.deviceplugin.podview.PodView`
(:func:`pod_view`). :class:`hami.deviceplugin.kube.KubeApi` starts the watches, reads
them and offers them its own patch responses.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from hami.deviceplugin.podview import ContainerView, PodView

log = logging.getLogger(__name__)


def container_states(status: Any) -> dict[str, str]:
    """Container name -> ``"running"`` / ``"waiting"`` / ``"terminated"`` from a lightkube
    ``PodStatus`` (init and regular container statuses); a status with no state set is
    left out. ``status`` None gives ``{}``."""
    out: dict[str, str] = {}
    if status is None:
        return out
    for cs in [*(status.initContainerStatuses or []), *(status.containerStatuses or [])]:
        state = cs.state
        if state is None or not cs.name:
            continue
        for name in ("running", "terminated", "waiting"):
            if getattr(state, name, None) is not None:
                out[cs.name] = name
                break
    return out


def pod_view(pod: Any) -> PodView:
    """PodView from a lightkube ``Pod`` (init containers first; literal env values only)."""
    meta, spec = pod.metadata, pod.spec
    init = list(spec.initContainers or []) if spec else []
    regular = list(spec.containers or []) if spec else []
    containers = tuple(
        ContainerView(c.name, {e.name: e.value for e in (c.env or []) if e.value is not None})
        for c in init + regular)
    return PodView(
        namespace=meta.namespace or "", name=meta.name or "", uid=meta.uid or "",
        node_name=(spec.nodeName or "") if spec else "",
        phase=(pod.status.phase or "Pending") if pod.status else "Pending",
        annotations=dict(meta.annotations or {}), containers=containers, n_init=len(init),
        labels=dict(meta.labels or {}), resource_version=meta.resourceVersion or "",
        container_states=container_states(pod.status),
        scheduler_name=(spec.schedulerName or "") if spec else "",
        resource_names=frozenset(
            str(k) for c in init + regular if c.resources is not None
            for part in (c.resources.limits, c.resources.requests) for k in (part or {})),
        deleting=meta.deletionTimestamp is not None,
        sidecars=frozenset(c.name for c in init if c.restartPolicy == "Always"))


def _rv_newer(a: str, b: str) -> bool:
    """True when resourceVersion ``a`` is newer than ``b`` (etcd revisions are integers;
    anything else: treat ``a`` as newer)."""
    if a.isdigit() and b.isdigit():
        return int(a) > int(b)
    return True


class NodeWatch:
    """A watched copy of one Node's ``(annotations, resourceVersion)``.

    Readers get None while the watch is (re)connecting after an error. Our own patch
    responses are :meth:`offer`-ed so a read right after our write is never older than
    it. A stale copy is harmless for Allocate: the lock owner it names is re-read live,
    and every Pending pod of the node is considered besides. A watch silent past the
    client's idle deadline (no event, no bookmark) is resumed at once from the last
    resourceVersion seen, keeping the copy; BOOKMARK events only move that version and
    prove the watch alive (``bookmarks`` counts them).
    """

    def __init__(self, client: Any, node: str, server_timeout_s: int = 300) -> None:
        self.client = client
        self.node = node
        self.server_timeout_s = server_timeout_s
        self._value: tuple[dict[str, str], str] | None = None
        self._lock = threading.Lock()
        self.events = 0
        self.bookmarks = 0
        self.idle_restarts = 0

    def get(self) -> tuple[dict[str, str], str] | None:
        """A copy of the watched ``(annotations, resourceVersion)``; None while there is
        none (starting, reconnecting, node deleted)."""
        with self._lock:
            return None if self._value is None else (dict(self._value[0]), self._value[1])

    def offer(self, annotations: dict[str, str], rv: str) -> None:
        """Take ``(annotations, rv)`` when it is newer than the copy (or there is none)."""
        with self._lock:
            if self._value is None or _rv_newer(rv, self._value[1]):
                self._value = (dict(annotations), rv)

    def run(self, stop: threading.Event) -> None:
        """Watch the node until ``stop`` (the thread :meth:`KubeApi.start_node_watch
        <hami.deviceplugin.kube.KubeApi.start_node_watch>` starts)."""
        import httpx2
        from lightkube.resources.core_v1 import Node

        resume: str | None = None  # after an idle deadline: the last version seen
        while not stop.is_set():
            try:
                for kind, obj in self.client.watch(Node, fields={"metadata.name": self.node},
                                                   server_timeout=self.server_timeout_s,
                                                   resource_version=resume):
                    resume = (obj.metadata.resourceVersion if obj.metadata else None) or resume
                    if kind == "BOOKMARK":
                        self.bookmarks += 1
                    else:
                        self._apply(kind, obj)
                    if stop.is_set():
                        return
            except httpx2.ReadTimeout:
                # Resume after the last version seen: a change (or the node's deletion)
                # made while the connection was silent arrives on the new watch.
                self.idle_restarts += 1
                log.info("node watch %s silent past its idle deadline; resuming from %s",
                         self.node, resume)
            except Exception as exc:  # noqa: BLE001 - reconnect; readers fall back to GET
                log.info("node watch %s restarting: %s", self.node, exc)
                resume = None  # 410 and the like: start over with the node's current state
                with self._lock:
                    self._value = None
                stop.wait(1.0)

    def _apply(self, kind: str, obj: Any) -> None:
        """One event with a whole Node: DELETED drops the copy, any other offers it."""
        self.events += 1
        if kind == "DELETED":
            with self._lock:
                self._value = None
        else:
            self.offer(dict(obj.metadata.annotations or {}), obj.metadata.resourceVersion or "")


def _raw_pod_resource() -> Any:
    """Pods as plain dicts (lightkube's generic resource), for the pod watch."""
    from lightkube.generic_resource import GenericNamespacedResource
    from lightkube.generic_resource import create_api_info as api_info

    class RawPod(GenericNamespacedResource):
        _api_info = api_info("", "v1", "Pod", "pods")

    return RawPod


class PodWatch:
    """A watched copy of the Pending pods bound to one node (``spec.nodeName``), as
    :class:`PodView` by ``(namespace, name)``.

    Informer-style: a LIST gives the pods and its resourceVersion, a watch from there
    keeps them (a pod that leaves Pending arrives as DELETED: the field selector no longer
    matches). A watch silent past the client's idle deadline is resumed from the last
    resourceVersion seen, keeping the copy (BOOKMARK events only move that version); on
    any other error the copy is dropped, readers get None (and list live), and a new LIST
    rebuilds it. Our own patch responses are :meth:`offer`-ed. Why a watch: a consistent
    LIST waits for the apiserver's cache to catch up with the latest write (tens of ms
    right after a Binding); the watched copy answers at once, and Allocate re-reads the
    pod it serves live.
    """

    def __init__(self, client: Any, node: str, server_timeout_s: int = 300) -> None:
        self.client = client
        self.node = node
        self.server_timeout_s = server_timeout_s
        self.fields = {"spec.nodeName": node, "status.phase": "Pending"}
        self._pods: dict[tuple[str, str], PodView] | None = None
        self._lock = threading.Lock()
        self.events = 0
        self.bookmarks = 0

    def pods(self) -> list[PodView] | None:
        """The watched Pending pods; None while there is no copy (listing, relisting)."""
        with self._lock:
            return None if self._pods is None else list(self._pods.values())

    def offer(self, pod: PodView) -> None:
        """Take a newer copy of a pod (an event, or our own patch response)."""
        with self._lock:
            if self._pods is None:
                return
            key = (pod.namespace, pod.name)
            old = self._pods.get(key)
            if old is not None and not _rv_newer(pod.resource_version, old.resource_version):
                return
            if pod.node_name == self.node and pod.phase == "Pending":
                self._pods[key] = pod
            else:
                self._pods.pop(key, None)

    def run(self, stop: threading.Event) -> None:
        """List, then watch, the node's Pending pods until ``stop`` (the thread
        :meth:`KubeApi.start_pod_watch <hami.deviceplugin.kube.KubeApi.start_pod_watch>`
        starts)."""
        import httpx2
        from lightkube.resources.core_v1 import Pod

        raw_pod = _raw_pod_resource()
        resume: str | None = None  # the last version seen; None: list again
        while not stop.is_set():
            try:
                if resume is None:
                    resume = self._relist(Pod)
                # Plain dicts: a BOOKMARK's Pod has ``spec.containers: null``, which the
                # typed Pod refuses; the events with a whole pod are typed below.
                for kind, obj in self.client.watch(raw_pod, namespace="*", fields=self.fields,
                                                   server_timeout=self.server_timeout_s,
                                                   resource_version=resume):
                    meta = obj.get("metadata") or {}
                    resume = meta.get("resourceVersion") or resume
                    if kind == "BOOKMARK":
                        self.bookmarks += 1
                    else:
                        self._apply(kind, obj, Pod)
                    if stop.is_set():
                        return
            except httpx2.ReadTimeout:
                log.info("pod watch %s silent past its idle deadline; resuming from %s",
                         self.node, resume)
            except Exception as exc:  # noqa: BLE001 - relist; readers fall back to LIST
                log.info("pod watch %s restarting: %s", self.node, exc)
                resume = None
                with self._lock:
                    self._pods = None
                stop.wait(1.0)

    def _relist(self, pod_type: Any) -> str | None:
        """LIST the node's Pending pods into the copy; returns the listing's
        resourceVersion (where the watch starts)."""
        listing = self.client.list(pod_type, namespace="*", fields=self.fields)
        pods = {(v.namespace, v.name): v for v in map(pod_view, listing)}
        with self._lock:
            self._pods = pods
        version: str | None = listing.resourceVersion
        return version

    def _apply(self, kind: str, obj: Any, pod_type: Any) -> None:
        """One event with a whole pod (a plain dict): DELETED drops it from the copy, any
        other offers it typed as ``pod_type`` (lightkube's ``Pod``)."""
        self.events += 1
        if kind == "DELETED":
            meta = obj.get("metadata") or {}
            with self._lock:
                if self._pods is not None:
                    self._pods.pop((meta.get("namespace") or "", meta.get("name") or ""), None)
        else:
            self.offer(pod_view(pod_type.from_dict(dict(obj))))
