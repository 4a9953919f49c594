"""Thin Kubernetes I/O for the node components (lightkube, synchronous).

Every call is one API round trip; callers own retries. Pods come back as
:class:`~hami.deviceplugin.allocate.PodView` so the decision code never sees lightkube.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hami.deviceplugin.allocate import NODE_LOCK, VGPU_NODE, ContainerView, PodView
from hami.kubehttp import DEFAULT_WATCH_IDLE_TIMEOUT_S

log = logging.getLogger(__name__)


class KubeError(RuntimeError):
    """An API call failed; ``code`` is the HTTP status when known (409 = conflict)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


def make_client(kubeconfig: Path | None = None, *,
                watch_idle_timeout_s: float = DEFAULT_WATCH_IDLE_TIMEOUT_S) -> Any:
    """A lightkube ``Client``: from ``kubeconfig``, else in-cluster/``$KUBECONFIG``.

    Watches ask for bookmarks and raise ``httpx2.ReadTimeout`` after
    ``watch_idle_timeout_s`` seconds without a byte; connections have TCP keepalive
    (:mod:`hami.kubehttp`)."""
    from lightkube import Client, KubeConfig

    from hami.kubehttp import sync_transport

    config = KubeConfig.from_file(str(kubeconfig)) if kubeconfig is not None \
        else KubeConfig.from_env()
    transport = sync_transport(config.get(), idle_timeout_s=watch_idle_timeout_s)
    return Client(config=config, field_manager="hami-node", transport=transport)


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
            for part in (c.resources.limits, c.resources.requests) for k in (part or {})))


def _api_error(exc: Exception) -> KubeError:
    code = getattr(getattr(exc, "status", None), "code", None)
    return KubeError(str(exc), code)


class KubeApi:
    """The handful of calls the device plugin and the monitor make."""

    def __init__(self, client: Any, *, watch_timeout_s: int = 300) -> None:
        self.client = client
        self.node_watch: NodeWatch | None = None
        #: ``timeoutSeconds`` of the node watch's requests (see
        #: :func:`hami.kubehttp.watch_timeout_for`).
        self.watch_timeout_s = watch_timeout_s
        self.pod_watch: PodWatch | None = None

    def start_node_watch(self, node: str, stop: threading.Event) -> NodeWatch:
        """Keep a watched copy of the node (the plugin reads the node lock from it)."""
        self.node_watch = NodeWatch(self.client, node, self.watch_timeout_s)
        threading.Thread(target=self.node_watch.run, args=(stop,), name="node-watch",
                         daemon=True).start()
        return self.node_watch

    def start_pod_watch(self, node: str, stop: threading.Event) -> PodWatch:
        """Keep a watched copy of the node's Pending pods (Allocate reads it)."""
        self.pod_watch = PodWatch(self.client, node, self.watch_timeout_s)
        threading.Thread(target=self.pod_watch.run, args=(stop,), name="pod-watch",
                         daemon=True).start()
        return self.pod_watch

    def pending_pods(self, node: str) -> list[PodView]:
        """The node's Pending pods: the watched copy when it is live, else a LIST."""
        if self.pod_watch is not None:
            cached = self.pod_watch.pods()
            if cached is not None:
                return cached
        return self.pending_pods_on_node(node)

    def node_annotations(self, node: str) -> tuple[dict[str, str], str]:
        """The watched node when the watch is live, else a GET (same return shape)."""
        if self.node_watch is not None:
            cached = self.node_watch.get()
            if cached is not None:
                return cached
        return self.get_node_annotations(node)

    def get_node_annotations(self, node: str) -> tuple[dict[str, str], str]:
        """``(annotations, resourceVersion)`` of a Node. Raises :class:`KubeError`."""
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Node

        try:
            n = self.client.get(Node, node)
        except ApiError as exc:
            raise _api_error(exc) from None
        except Exception as exc:  # noqa: BLE001 - transport (connect/TLS/timeout): retryable
            raise KubeError(f"{type(exc).__name__}: {exc}") from None
        return dict(n.metadata.annotations or {}), n.metadata.resourceVersion or ""

    def get_pod(self, namespace: str, name: str) -> PodView | None:
        """The pod, or None when it does not exist. Raises :class:`KubeError`."""
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Pod

        try:
            return pod_view(self.client.get(Pod, name, namespace=namespace))
        except ApiError as exc:
            if getattr(exc.status, "code", None) == 404:
                return None
            raise _api_error(exc) from None
        except Exception as exc:  # noqa: BLE001 - transport (connect/TLS/timeout): retryable
            raise KubeError(f"{type(exc).__name__}: {exc}") from None

    def pods_on_node(self, node: str) -> list[PodView]:
        """Pods with ``spec.nodeName == node`` in every namespace."""
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Pod

        try:
            return [pod_view(p) for p in self.client.list(
                Pod, namespace="*", fields={"spec.nodeName": node})]
        except ApiError as exc:
            raise _api_error(exc) from None
        except Exception as exc:  # noqa: BLE001 - transport (connect/TLS/timeout): retryable
            raise KubeError(f"{type(exc).__name__}: {exc}") from None

    def pending_pods_on_node(self, node: str) -> list[PodView]:
        """Pods with ``spec.nodeName == node`` and ``status.phase == Pending`` (the pods
        that may still get an Allocate; few, unlike all pods of the node)."""
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Pod

        try:
            return [pod_view(p) for p in self.client.list(
                Pod, namespace="*", fields={"spec.nodeName": node, "status.phase": "Pending"})]
        except ApiError as exc:
            raise _api_error(exc) from None
        except Exception as exc:  # noqa: BLE001 - transport (connect/TLS/timeout): retryable
            raise KubeError(f"{type(exc).__name__}: {exc}") from None

    def pods_labelled_for(self, node: str) -> list[PodView]:
        """Pods labelled ``hami.io/vgpu-node=<node>`` (the monitor's selection, HAMi-core 1.2)."""
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Pod

        try:
            return [pod_view(p) for p in self.client.list(
                Pod, namespace="*", labels={VGPU_NODE: node})]
        except ApiError as exc:
            raise _api_error(exc) from None
        except Exception as exc:  # noqa: BLE001 - transport (connect/TLS/timeout): retryable
            raise KubeError(f"{type(exc).__name__}: {exc}") from None

    def patch_pod_annotations(self, namespace: str, name: str,
                              annotations: Mapping[str, str | None],
                              resource_version: str | None = None) -> PodView:
        """JSON merge patch of pod annotations; ``hami.io/vgpu-node`` is mirrored into the
        labels (HAMi-core 1.2). With ``resource_version`` the patch is a compare-and-swap
        (409 -> :class:`KubeError` with ``code`` 409). Returns the patched pod."""
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Pod
        from lightkube.types import PatchType

        meta: dict[str, Any] = {"annotations": dict(annotations)}
        if resource_version:
            meta["resourceVersion"] = resource_version
        if VGPU_NODE in annotations:
            meta["labels"] = {VGPU_NODE: annotations[VGPU_NODE]}
        try:
            patched = pod_view(self.client.patch(Pod, name, {"metadata": meta},
                                                 namespace=namespace, patch_type=PatchType.MERGE))
            if self.pod_watch is not None:
                self.pod_watch.offer(patched)
            return patched
        except ApiError as exc:
            raise _api_error(exc) from None
        except Exception as exc:  # noqa: BLE001 - transport (connect/TLS/timeout): retryable
            raise KubeError(f"{type(exc).__name__}: {exc}") from None

    def patch_node_annotations(self, node: str, annotations: Mapping[str, str | None],
                               resource_version: str | None = None) -> tuple[dict[str, str], str] | None:
        """JSON merge patch of node annotations, compare-and-swap when ``resource_version``
        is given (409 -> :class:`KubeError` with ``code`` 409). Returns the node's new
        ``(annotations, resourceVersion)``."""
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Node
        from lightkube.types import PatchType

        meta: dict[str, Any] = {"annotations": dict(annotations)}
        if resource_version:
            meta["resourceVersion"] = resource_version
        try:
            n = self.client.patch(Node, node, {"metadata": meta}, patch_type=PatchType.MERGE)
        except ApiError as exc:
            raise _api_error(exc) from None
        except Exception as exc:  # noqa: BLE001 - transport (connect/TLS/timeout): retryable
            raise KubeError(f"{type(exc).__name__}: {exc}") from None
        return dict(n.metadata.annotations or {}), n.metadata.resourceVersion or ""

    def release_node_lock(self, node: str, namespace: str, name: str,
                          known: tuple[dict[str, str], str] | None = None,
                          attempts: int = 5) -> bool:
        """Remove ``hami.io/mutex.lock`` if it names this pod (or is legacy), with a
        resourceVersion CAS and retries (HAMi v2.10 ReleaseNodeLock).

        ``known`` is a recent ``(annotations, resourceVersion)`` to skip the first GET.
        Returns True when the lock is gone or not ours; False after ``attempts`` failures.
        """
        from hami.deviceplugin.allocate import lock_releasable

        delay = 0.05
        for attempt in range(attempts):
            try:
                # A snapshot (possibly from the watch) is only trusted when it shows our
                # lock: the CAS then fails on anything newer. Otherwise read it live.
                if attempt == 0 and known and lock_releasable(known[0].get(NODE_LOCK),
                                                              namespace, name):
                    annotations, rv = known
                else:
                    annotations, rv = self.get_node_annotations(node)
                value = annotations.get(NODE_LOCK)
                if not value or not lock_releasable(value, namespace, name):
                    return True
                after = self.patch_node_annotations(node, {NODE_LOCK: None}, rv)
                if after is not None and self.node_watch is not None:
                    self.node_watch.offer(*after)
                return True
            except KubeError as exc:
                log.info("release node lock %s (attempt %d): %s", node, attempt + 1, exc)
                time.sleep(delay)
                delay *= 2
        return False


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
        with self._lock:
            return None if self._value is None else (dict(self._value[0]), self._value[1])

    def offer(self, annotations: dict[str, str], rv: str) -> None:
        with self._lock:
            if self._value is None or _rv_newer(rv, self._value[1]):
                self._value = (dict(annotations), rv)

    def run(self, stop: threading.Event) -> None:
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
                        if stop.is_set():
                            return
                        continue
                    self.events += 1
                    if kind == "DELETED":
                        with self._lock:
                            self._value = None
                    else:
                        self.offer(dict(obj.metadata.annotations or {}),
                                   obj.metadata.resourceVersion or "")
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
        import httpx2
        from lightkube.resources.core_v1 import Pod

        raw_pod = _raw_pod_resource()
        resume: str | None = None  # the last version seen; None: list again
        while not stop.is_set():
            try:
                if resume is None:
                    listing = self.client.list(Pod, namespace="*", fields=self.fields)
                    pods = {(v.namespace, v.name): v for v in map(pod_view, listing)}
                    with self._lock:
                        self._pods = pods
                    resume = listing.resourceVersion
                # Plain dicts: a BOOKMARK's Pod has ``spec.containers: null``, which the
                # typed Pod refuses; the events with a whole pod are typed below.
                for kind, obj in self.client.watch(raw_pod, namespace="*", fields=self.fields,
                                                   server_timeout=self.server_timeout_s,
                                                   resource_version=resume):
                    meta = obj.get("metadata") or {}
                    resume = meta.get("resourceVersion") or resume
                    if kind == "BOOKMARK":
                        self.bookmarks += 1
                    elif kind == "DELETED":
                        self.events += 1
                        with self._lock:
                            if self._pods is not None:
                                self._pods.pop((meta.get("namespace") or "",
                                                meta.get("name") or ""), None)
                    else:
                        self.events += 1
                        self.offer(pod_view(Pod.from_dict(dict(obj))))
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
