"""Thin Kubernetes I/O for the node components (lightkube, synchronous).

Every call is one API round trip; callers own retries. Pods come back as
:class:`~hami.deviceplugin.podview.PodView` so the decision code never sees lightkube.
The watched copies of the node and of its Pending pods (:class:`NodeWatch`,
:class:`PodWatch`) and the conversion of lightkube pods (:func:`pod_view`) live in
:mod:`hami.deviceplugin.kubewatch` and are re-exported here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hami.deviceplugin.kubewatch import NodeWatch, PodWatch, container_states, pod_view
from hami.deviceplugin.podchoice import lock_releasable
from hami.deviceplugin.podview import NODE_LOCK, VGPU_NODE, PodView
from hami.kubehttp import DEFAULT_WATCH_IDLE_TIMEOUT_S

__all__ = ["KubeApi", "KubeError", "NodeWatch", "PodWatch", "container_states", "make_client",
           "pod_view"]

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
    from lightkube import Client

    from hami.kubehint import load_kubeconfig
    from hami.kubehttp import sync_transport

    config = load_kubeconfig(kubeconfig)
    transport = sync_transport(config.get(), idle_timeout_s=watch_idle_timeout_s)
    return Client(config=config, field_manager="hami-node", transport=transport)


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

    def _get_node(self, node: str) -> Any:
        """The Node (lightkube model). Raises :class:`KubeError` (API errors and
        transport errors alike)."""
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Node

        try:
            return self.client.get(Node, node)
        except ApiError as exc:
            raise _api_error(exc) from None
        except Exception as exc:  # noqa: BLE001 - transport (connect/TLS/timeout): retryable
            raise KubeError(f"{type(exc).__name__}: {exc}") from None

    def get_node_annotations(self, node: str) -> tuple[dict[str, str], str]:
        """``(annotations, resourceVersion)`` of a Node. Raises :class:`KubeError`."""
        n = self._get_node(node)
        return dict(n.metadata.annotations or {}), n.metadata.resourceVersion or ""

    def node_versions(self, node: str) -> tuple[str, str]:
        """``(containerRuntimeVersion, kubeletVersion)`` from the Node's
        ``status.nodeInfo`` (e.g. ``("containerd://2.4.2", "v1.31.0")``; ``""`` where
        the kubelet reported nothing). Raises :class:`KubeError`."""
        n = self._get_node(node)
        info = n.status.nodeInfo if n.status is not None else None
        if info is None:
            return "", ""
        return info.containerRuntimeVersion or "", info.kubeletVersion or ""

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

    def review_token(self, token: str) -> dict[str, Any]:
        """Create a TokenReview (authentication.k8s.io/v1) of ``token``; returns its
        ``status`` as a plain dict (``authenticated``, ``user``, ``error``). Raises
        :class:`KubeError`."""
        from lightkube.models.authentication_v1 import TokenReviewSpec
        from lightkube.resources.authentication_v1 import TokenReview

        return self._review(TokenReview(spec=TokenReviewSpec(token=token)))

    def review_access(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Create a SubjectAccessReview (authorization.k8s.io/v1) with ``spec`` (a plain
        dict); returns its ``status`` (``allowed``, ``denied``, ``reason``). Raises
        :class:`KubeError`."""
        from lightkube.resources.authorization_v1 import SubjectAccessReview

        return self._review(SubjectAccessReview.from_dict({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": dict(spec)}))

    def _review(self, body: Any) -> dict[str, Any]:
        from lightkube import ApiError

        try:
            result = self.client.create(body)
        except ApiError as exc:
            raise _api_error(exc) from None
        except Exception as exc:  # noqa: BLE001 - transport (connect/TLS/timeout): retryable
            raise KubeError(f"{type(exc).__name__}: {exc}") from None
        status = result.to_dict().get("status") if result is not None else None
        return dict(status or {})

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
