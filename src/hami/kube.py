"""The only module that talks to the Kubernetes API (through lightkube).

Objects cross this boundary as JSON-shaped dicts (what the core reads), never as client
models: Pods, Nodes, ResourceQuotas, Leases and Events are declared here as lightkube
*generic* resources (plain dicts, no model decoding, every field kept) and are not put in
lightkube's global registry, so code that uses lightkube's typed models is unaffected.
Errors become :class:`KubeError` with the HTTP status code (0 for transport errors).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.core import resource as lkres
from lightkube.generic_resource import (
    Generic,
    GenericGlobalResource,
    GenericNamespacedResource,
    create_api_info,
)
from lightkube.types import PatchType, on_error_raise

from hami.kubehint import load_kubeconfig
from hami.kubehttp import DEFAULT_WATCH_IDLE_TIMEOUT_S, async_transport, watch_timeout_for

JSON = dict[str, Any]
JSONList = list[JSON]


class KubeError(Exception):
    """An API call failed. ``code`` is the HTTP status (404, 409, 410...), 0 when the
    request never got an answer."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.code == 404

    @property
    def conflict(self) -> bool:
        return self.code == 409


class WatchIdle(KubeError):
    """A watch delivered no event and no bookmark within its idle deadline: restart it
    from the last resourceVersion (code 0: no HTTP status)."""

    def __init__(self, message: str) -> None:
        super().__init__(0, message)


class _Pod(GenericNamespacedResource):
    _api_info = create_api_info("", "v1", "Pod", "pods")


class _Node(GenericGlobalResource):
    _api_info = create_api_info("", "v1", "Node", "nodes")


class _ResourceQuota(GenericNamespacedResource):
    _api_info = create_api_info("", "v1", "ResourceQuota", "resourcequotas")


class _Event(GenericNamespacedResource):
    _api_info = create_api_info("", "v1", "Event", "events")


class _Lease(GenericNamespacedResource):
    _api_info = create_api_info("coordination.k8s.io", "v1", "Lease", "leases")


class _Binding(lkres.NamespacedSubResource, Generic):  # type: ignore[misc]
    """``pods/<name>/binding``; the reply is a Status, decoded as a plain dict."""

    _api_info = lkres.ApiInfo(resource=lkres.ResourceDef("", "v1", "Binding"),
                              parent=lkres.ResourceDef("", "v1", "Pod"), plural="pods",
                              verbs=["post"], action="binding")


class _TokenReview(GenericGlobalResource):
    _api_info = create_api_info("authentication.k8s.io", "v1", "TokenReview", "tokenreviews")


class _SubjectAccessReview(GenericGlobalResource):
    _api_info = create_api_info("authorization.k8s.io", "v1", "SubjectAccessReview",
                                "subjectaccessreviews")


class _Eviction(lkres.NamespacedSubResource, Generic):  # type: ignore[misc]
    """``pods/<name>/eviction`` (``policy/v1`` Eviction); the reply is a Status."""

    _api_info = lkres.ApiInfo(resource=lkres.ResourceDef("policy", "v1", "Eviction"),
                              parent=lkres.ResourceDef("", "v1", "Pod"), plural="pods",
                              verbs=["post"], action="eviction")


class _PodStatus(lkres.NamespacedSubResource, Generic):  # type: ignore[misc]
    """``pods/<name>/status``."""

    _api_info = lkres.ApiInfo(resource=lkres.ResourceDef("", "v1", "Pod"),
                              parent=lkres.ResourceDef("", "v1", "Pod"), plural="pods",
                              verbs=["patch"], action="status")


class _PodDisruptionBudget(GenericNamespacedResource):
    _api_info = create_api_info("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets")


KINDS: dict[str, type] = {"Pod": _Pod, "Node": _Node, "ResourceQuota": _ResourceQuota}
ALL = "*"  # lightkube.ALL_NS


def _error(exc: Exception) -> KubeError:
    if isinstance(exc, ApiError):
        return KubeError(int(exc.status.code or 0), str(exc.status.message or exc))
    return KubeError(0, f"{type(exc).__name__}: {exc}")


def _plain(obj: Any) -> JSON:
    return dict(obj) if isinstance(obj, dict) else obj.to_dict()


class Kube:
    """Async access to the API objects the scheduler reads and writes."""

    def __init__(self, client: AsyncClient, *, max_inflight: int = 32,
                 watch_timeout_s: int = 300) -> None:
        # Typed as Any: the generic resources here are plain dicts, which lightkube's
        # overloads (written for its models) do not describe.
        self.client: Any = client
        # kube-scheduler binds without bound; a burst of binds must not become a burst of
        # thousands of concurrent writes on the apiserver (HAMi has --kube-qps for this).
        self._inflight = asyncio.Semaphore(max_inflight)
        #: ``timeoutSeconds`` of each watch request (the API server ends the watch then,
        #: sending a bookmark just before; lightkube reconnects from the last version).
        self.watch_timeout_s = watch_timeout_s

    @classmethod
    def connect(cls, kubeconfig: str | Path | None = None, *, timeout_s: float = 10.0,
                field_manager: str = "hami-scheduler", max_inflight: int = 32,
                watch_idle_timeout_s: float = DEFAULT_WATCH_IDLE_TIMEOUT_S) -> Kube:
        """From a kubeconfig file (``$KUBECONFIG`` when None), else the in-cluster config.

        Watches ask for bookmarks and end with :class:`WatchIdle` after
        ``watch_idle_timeout_s`` seconds without a byte; every connection has TCP
        keepalive (:mod:`hami.kubehttp`). Watch requests last half the idle deadline
        (:func:`~hami.kubehttp.watch_timeout_for`), so a healthy quiet watch is renewed
        by the API server before the deadline could cut it."""
        path = kubeconfig or os.environ.get("KUBECONFIG")
        config = load_kubeconfig(path)
        transport = async_transport(config.get(), idle_timeout_s=watch_idle_timeout_s)
        client = AsyncClient(config, field_manager=field_manager, trust_env=False,
                             timeout=httpx2.Timeout(timeout_s), transport=transport)
        return cls(client, max_inflight=max_inflight,
                   watch_timeout_s=watch_timeout_for(watch_idle_timeout_s))

    async def close(self) -> None:
        await self.client.close()

    # ---------------------------------------------------------------- reads
    async def list(self, kind: str, on_item: Callable[[JSON], None], *,
                   chunk_size: int = 500) -> str:
        """Every object of ``kind`` (all namespaces), handed to ``on_item`` one at a time as
        the chunks arrive (never the whole list in memory); returns the list's
        resourceVersion."""
        res = KINDS[kind]
        kwargs: dict[str, Any] = {"chunk_size": chunk_size}
        if issubclass(res, lkres.NamespacedResource):
            kwargs["namespace"] = ALL
        try:
            listing = self.client.list(res, **kwargs)
            async for obj in listing:
                on_item(_plain(obj))
            return str(listing.resourceVersion or "")
        except (ApiError, httpx2.HTTPError, OSError) as exc:
            raise _error(exc) from None

    async def watch(self, kind: str, resource_version: str,
                    server_timeout_s: int | None = None) -> AsyncIterator[tuple[str, JSON]]:
        """Events after ``resource_version``, BOOKMARK events included (they carry only a
        resourceVersion). Raises :class:`WatchIdle` when the connection stayed silent past
        the idle deadline (resume from the last version), :class:`KubeError` otherwise
        (410 when the version is too old, so the caller relists)."""
        res = KINDS[kind]
        kwargs: dict[str, Any] = {"resource_version": resource_version,
                                  "server_timeout": server_timeout_s or self.watch_timeout_s,
                                  "on_error": on_error_raise}
        if issubclass(res, lkres.NamespacedResource):
            kwargs["namespace"] = ALL
        try:
            async for kind_of_event, obj in self.client.watch(res, **kwargs):
                yield kind_of_event, _plain(obj)
        except httpx2.ReadTimeout as exc:
            raise WatchIdle(f"{kind} watch silent past its idle deadline ({exc})") from None
        except (ApiError, httpx2.HTTPError, OSError) as exc:
            raise _error(exc) from None

    async def get_node(self, name: str) -> JSON:
        return await self._call(self.client.get(_Node, name))

    async def get_pod(self, namespace: str, name: str) -> JSON | None:
        """The pod, or None when it does not exist."""
        try:
            return await self._call(self.client.get(_Pod, name, namespace=namespace))
        except KubeError as exc:
            if exc.not_found:
                return None
            raise

    # --------------------------------------------------------------- writes
    async def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> JSON:
        """JSON merge patch of a pod."""
        return await self._call(self.client.patch(_Pod, name, dict(patch), namespace=namespace,
                                                  patch_type=PatchType.MERGE))

    async def patch_node(self, name: str, patch: Mapping[str, Any]) -> JSON:
        """JSON merge patch of a node (409 when ``metadata.resourceVersion`` is stale)."""
        return await self._call(self.client.patch(_Node, name, dict(patch),
                                                  patch_type=PatchType.MERGE))

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   annotations: Mapping[str, str] | None = None,
                   labels: Mapping[str, str] | None = None) -> None:
        """POST ``pods/<name>/binding`` to ``node``. ``annotations`` ride on the Binding:
        the API server copies them onto the pod in the write that sets ``spec.nodeName``
        (Kubernetes' pod registry, BindingREST); ``labels`` likewise, but only where the
        server copies them (v1.35.4 and v1.37.2 do, v1.33.13 does not:
        :mod:`hami.core.clusterfacts`)."""
        meta: JSON = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        if annotations:
            meta["annotations"] = dict(annotations)
        if labels:
            meta["labels"] = dict(labels)
        body = _Binding.from_dict({"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                                   "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
        await self._call(self.client.create(body, name=name, namespace=namespace))

    async def list_pdbs(self) -> JSONList:
        """Every ``policy/v1`` PodDisruptionBudget (all namespaces)."""
        try:
            return [_plain(obj) async for obj in
                    self.client.list(_PodDisruptionBudget, namespace=ALL)]
        except (ApiError, httpx2.HTTPError, OSError) as exc:
            raise _error(exc) from None

    async def evict(self, namespace: str, name: str, uid: str) -> None:
        """POST ``pods/<name>/eviction`` (``policy/v1`` Eviction) with the pod's UID as a
        precondition. The API server refuses it (429) where a PodDisruptionBudget
        forbids it; 404 when the pod is gone."""
        body = _Eviction.from_dict({
            "apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}} if uid else {}})
        await self._call(self.client.create(body, name=name, namespace=namespace))

    async def patch_pod_status(self, namespace: str, name: str,
                               patch: Mapping[str, Any]) -> JSON:
        """JSON merge patch of a pod's ``status`` subresource."""
        return await self._call(self.client.patch(_PodStatus, name, dict(patch),
                                                  namespace=namespace,
                                                  patch_type=PatchType.MERGE))

    async def create_event(self, event: Mapping[str, Any]) -> None:
        namespace = event["metadata"]["namespace"]
        body: Any = _Event.from_dict(dict(event))
        await self._call(self.client.create(body, namespace=namespace))

    async def get_lease(self, namespace: str, name: str) -> JSON | None:
        try:
            return await self._call(self.client.get(_Lease, name, namespace=namespace))
        except KubeError as exc:
            if exc.not_found:
                return None
            raise

    async def create_lease(self, namespace: str, name: str, spec: Mapping[str, Any]) -> JSON:
        body: Any = _Lease.from_dict({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                            "metadata": {"name": name, "namespace": namespace},
                            "spec": dict(spec)})
        return await self._call(self.client.create(body, namespace=namespace))

    async def replace_lease(self, namespace: str, name: str, spec: Mapping[str, Any],
                            resource_version: str) -> JSON:
        body: Any = _Lease.from_dict({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                            "metadata": {"name": name, "namespace": namespace,
                                         "resourceVersion": resource_version},
                            "spec": dict(spec)})
        replace: Any = self.client.replace
        return await self._call(replace(body, namespace=namespace))

    # ------------------------------------------- delegated auth (secure /metrics)
    async def review_token(self, token: str) -> JSON:
        """Create a TokenReview (authentication.k8s.io/v1) of ``token``; returns its
        ``status`` (``authenticated``, ``user``: username, uid, groups, extra; ``error``).
        Raises :class:`KubeError`."""
        body: Any = _TokenReview.from_dict({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token}})
        return dict((await self._review(body)).get("status") or {})

    async def review_access(self, spec: Mapping[str, Any]) -> JSON:
        """Create a SubjectAccessReview (authorization.k8s.io/v1) with ``spec``; returns
        its ``status`` (``allowed``, ``denied``, ``reason``). Raises :class:`KubeError`."""
        body: Any = _SubjectAccessReview.from_dict({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": dict(spec)})
        return dict((await self._review(body)).get("status") or {})

    async def _review(self, body: Any) -> JSON:
        # Not through _call's semaphore: scrapes must not take the engine's API slots
        # (the metrics guard bounds its own reviews).
        try:
            result = await self.client.create(body)
        except (ApiError, httpx2.HTTPError, OSError) as exc:
            raise _error(exc) from None
        return _plain(result) if result is not None else {}

    async def _call(self, awaitable: Any) -> JSON:
        try:
            async with self._inflight:
                result = await awaitable
        except (ApiError, httpx2.HTTPError, OSError) as exc:
            raise _error(exc) from None
        if result is None:
            return {}
        return _plain(result)


def dumps(obj: Any) -> str:
    """Compact JSON for logs."""
    return json.dumps(obj, separators=(",", ":"), default=str)[:2000]


__all__ = ["JSON", "Kube", "KubeError", "WatchIdle"]
