"""HTTP transports for hami's Kubernetes clients (lightkube over httpx2).

lightkube opens watches with no read timeout and no way to pass ``allowWatchBookmarks``,
so a watch whose connection goes silent (a half-open TCP connection, a stuck proxy)
would wait forever and never see another event, deletions included. The transports here
wrap httpx2's standard ones (a public extension point of httpx) and, for every request
with ``watch=true``:

* add ``allowWatchBookmarks=true``: the API server then sends BOOKMARK events (an object
  with only a resourceVersion): at the end of the initial events of a watch without
  version, and before the watch's ``timeoutSeconds`` runs out when anything changed since;
* set the read timeout to ``watch_idle_timeout_s``: no byte for that long (no event and
  no bookmark) raises ``httpx2.ReadTimeout``, and the caller restarts the watch from its
  last resourceVersion.
* ask for an uncompressed body (``Accept-Encoding: identity``): when a watch's first
  write is large (the initial events of a watch without resourceVersion) kube-apiserver
  v1.37 gzips the stream, each later event as a gzip member of its own, and httpx2's
  decoder reads only the first member, so every later event would be lost without an
  error (``tests/e2e/test_watch_compression_e2e.py``).

The async pool is bounded (:data:`DEFAULT_POOL_CONNECTIONS`): httpx2's pool looks at
every idle connection (a socket poll each) whenever a request starts or ends, so a pool
that grew to one connection per concurrent request in a burst spends more CPU on that
than on the requests; a few kept-alive connections carry the same load.

Every connection, watch or not, has TCP keepalive (probe after 30 s idle, every 10 s,
dropped after 3 unanswered probes), so a peer that vanished is noticed by the kernel.
TLS settings are lightkube's own (:func:`lightkube.config.client_adapter.verify_cluster`).
"""

from __future__ import annotations

import socket
from typing import Any

import httpx2
from lightkube import ConfigError
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import SingleConfig

#: Seconds without an event or bookmark before a watch is restarted.
DEFAULT_WATCH_IDLE_TIMEOUT_S = 120.0
#: Connections of the async pool to the API server, watches included (each open watch
#: holds one; requests beyond the rest wait for a free one).
DEFAULT_POOL_CONNECTIONS = 12


def watch_timeout_for(idle_timeout_s: float) -> int:
    """``timeoutSeconds`` for watch requests under an idle deadline: half of it (at least
    1 s). The API server ends a watch at that time (with a bookmark just before when
    anything changed since the watch began), and the client reconnects from the last
    version, so bytes reach a healthy quiet watch well within the deadline; only a silent
    connection runs into it."""
    return max(1, int(idle_timeout_s // 2))


def keepalive_options() -> list[tuple[int, int, int]]:
    """Socket options for TCP keepalive (idle 30 s, interval 10 s, 3 probes) where the
    platform has them."""
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    return options


def is_watch(request: httpx2.Request) -> bool:
    return request.url.params.get("watch") in ("true", "1")


def prepare_watch(request: httpx2.Request, idle_timeout_s: float) -> None:
    """Bookmarks, the idle deadline and no compression on a watch request (in place);
    others untouched."""
    if not is_watch(request):
        return
    request.url = request.url.copy_merge_params({"allowWatchBookmarks": "true"})
    request.headers["Accept-Encoding"] = "identity"
    timeouts = dict(request.extensions.get("timeout") or {})
    timeouts["read"] = idle_timeout_s
    request.extensions = {**request.extensions, "timeout": timeouts}


class AsyncKubeTransport(httpx2.AsyncBaseTransport):
    """Async transport: :func:`prepare_watch`, then httpx2's own transport."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, idle_timeout_s: float) -> None:
        self.inner = inner
        self.idle_timeout_s = idle_timeout_s

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        prepare_watch(request, self.idle_timeout_s)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class KubeTransport(httpx2.BaseTransport):
    """Blocking transport: :func:`prepare_watch`, then httpx2's own transport."""

    def __init__(self, inner: httpx2.BaseTransport, idle_timeout_s: float) -> None:
        self.inner = inner
        self.idle_timeout_s = idle_timeout_s

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        prepare_watch(request, self.idle_timeout_s)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def _verify(config: SingleConfig | None, trust_env: bool) -> Any:
    if config is None or config.user is None:
        raise ConfigError("the kubeconfig has no current context with a user")
    return verify_cluster(config.cluster, config.user, config.abs_file, trust_env=trust_env)


def async_transport(config: SingleConfig | None, *, idle_timeout_s: float = DEFAULT_WATCH_IDLE_TIMEOUT_S,
                    trust_env: bool = False,
                    pool_connections: int = DEFAULT_POOL_CONNECTIONS) -> AsyncKubeTransport:
    """The transport for a lightkube ``AsyncClient`` on ``config`` (pass it as
    ``transport=``; TLS verification and client certificates come from ``config``).
    ``pool_connections``: most connections open at once, watches included; keep it above
    the number of watches the client holds open.

    Raises:
        lightkube.ConfigError: no config (a kubeconfig without current context) or no user.
    """
    limits = httpx2.Limits(max_connections=pool_connections,
                           max_keepalive_connections=pool_connections)
    inner = httpx2.AsyncHTTPTransport(verify=_verify(config, trust_env), trust_env=trust_env,
                                      socket_options=keepalive_options(), limits=limits)
    return AsyncKubeTransport(inner, idle_timeout_s)


def sync_transport(config: SingleConfig | None, *, idle_timeout_s: float = DEFAULT_WATCH_IDLE_TIMEOUT_S,
                   trust_env: bool = True) -> KubeTransport:
    """The transport for a lightkube ``Client`` on ``config`` (see :func:`async_transport`)."""
    inner = httpx2.HTTPTransport(verify=_verify(config, trust_env), trust_env=trust_env,
                                 socket_options=keepalive_options())
    return KubeTransport(inner, idle_timeout_s)


__all__ = ["DEFAULT_POOL_CONNECTIONS", "DEFAULT_WATCH_IDLE_TIMEOUT_S", "AsyncKubeTransport", "KubeTransport",
           "async_transport", "keepalive_options", "prepare_watch", "sync_transport",
           "watch_timeout_for"]
