"""The test harness's lightkube clients (:meth:`ControlPlane.client` and
:meth:`ControlPlane.async_client`): plain lightkube clients whose watch requests ask for
an uncompressed body.

When a watch's first write is large (the initial events of a watch without
resourceVersion) and the client accepts gzip, kube-apiserver v1.37 gzips the stream, each
later event as a gzip member of its own, and httpx2's decoder reads only the first member:
every later event would be lost without an error (the bug hami's own watches had, fixed in
:func:`hami.kubehttp.prepare_watch`). The transports here set ``Accept-Encoding:
identity`` on watch requests only; unlike :class:`hami.kubehttp.KubeTransport` they add no
``allowWatchBookmarks`` (typed lightkube watches cannot parse BOOKMARK events) and no idle
deadline. TLS verification and the client certificate come from the kubeconfig, through
lightkube's own :func:`~lightkube.config.client_adapter.verify_cluster`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import KubeConfig

from hami.kubehttp import is_watch

#: The field manager of the harness's writes.
FIELD_MANAGER = "hami-e2e"


def identity_on_watch(request: httpx2.Request) -> None:
    """``Accept-Encoding: identity`` on a watch request (in place); others untouched."""
    if is_watch(request):
        request.headers["Accept-Encoding"] = "identity"


class IdentityWatchTransport(httpx2.BaseTransport):
    """Blocking transport: :func:`identity_on_watch`, then httpx2's own transport."""

    def __init__(self, inner: httpx2.BaseTransport) -> None:
        self.inner = inner

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        identity_on_watch(request)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


class AsyncIdentityWatchTransport(httpx2.AsyncBaseTransport):
    """Async transport: :func:`identity_on_watch`, then httpx2's own transport."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        identity_on_watch(request)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _verify(config: Any) -> Any:
    return verify_cluster(config.cluster, config.user, config.abs_file, trust_env=False)


def admin_client(kubeconfig: Path, namespace: str = "default") -> Any:
    """A ``lightkube.Client`` for ``kubeconfig`` (its current context) whose watches ask
    for uncompressed bodies.

    Raises:
        lightkube.ConfigError: the kubeconfig has no current context.
    """
    from lightkube import Client

    config = KubeConfig.from_file(kubeconfig).get()
    transport = IdentityWatchTransport(httpx2.HTTPTransport(verify=_verify(config),
                                                            trust_env=False))
    return Client(config, namespace=namespace, field_manager=FIELD_MANAGER, trust_env=False,
                  transport=transport)


def admin_async_client(kubeconfig: Path, namespace: str = "default") -> Any:
    """A ``lightkube.AsyncClient`` like :func:`admin_client`."""
    from lightkube import AsyncClient

    config = KubeConfig.from_file(kubeconfig).get()
    transport = AsyncIdentityWatchTransport(
        httpx2.AsyncHTTPTransport(verify=_verify(config), trust_env=False))
    return AsyncClient(config, namespace=namespace, field_manager=FIELD_MANAGER,
                       trust_env=False, transport=transport)


__all__ = ["AsyncIdentityWatchTransport", "IdentityWatchTransport", "admin_async_client",
           "admin_client", "identity_on_watch"]
