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

The async transport sends through aiohttp's client (:class:`AiohttpTransport`):
lightkube and httpx2 still build every request (URL, auth, body) and read every answer,
and aiohttp's connection pool and C HTTP parser carry it, at about two thirds of the CPU
per request of httpx2's own transport (httpcore2 over anyio and h11), whose pool also
polls every idle connection whenever a request starts or ends. The pool is bounded
(:data:`DEFAULT_POOL_CONNECTIONS`, watches included): a burst shares a few kept-alive
connections instead of opening one per concurrent request.

Every connection, watch or not, has TCP keepalive (probe after 30 s idle, every 10 s,
dropped after 3 unanswered probes), so a peer that vanished is noticed by the kernel.
TLS settings are lightkube's own (:func:`lightkube.config.client_adapter.verify_cluster`).
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
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


class _AiohttpBody(httpx2.AsyncByteStream):
    """An aiohttp response body as httpx2 reads it; aiohttp's errors as httpx2's."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.response.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _httpx_error(exc, reading=True) from None

    async def aclose(self) -> None:
        # A body read to its end hands the connection back to the pool; one left unread
        # (a watch stopped mid-stream, an error answer not read) closes it.
        if self.response.content.at_eof():
            self.response.release()
        else:
            self.response.close()


def _httpx_error(exc: BaseException, *, reading: bool) -> httpx2.TransportError:
    """aiohttp's exception as the httpx2 one its callers catch: an idle read past its
    deadline is :class:`httpx2.ReadTimeout` (a watch then resumes), no connection in time
    :class:`httpx2.ConnectTimeout`, a refused or broken one :class:`httpx2.ConnectError` or
    :class:`httpx2.ReadError`."""
    message = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx2.ConnectTimeout(message)
    if isinstance(exc, TimeoutError):
        return httpx2.ReadTimeout(message)
    if isinstance(exc, aiohttp.ClientConnectorError) and not reading:
        return httpx2.ConnectError(message)
    return httpx2.ReadError(message)


class AiohttpTransport(httpx2.AsyncBaseTransport):
    """httpx2's async transport interface over an ``aiohttp.ClientSession``.

    Sends the request httpx2 built (method, URL, headers, body) as it is and hands back
    the status, headers and undecoded body (httpx2 decodes ``Content-Encoding`` itself);
    no redirects, no cookies; proxies from the environment only with ``trust_env``.
    Timeouts come from the
    request's ``timeout`` extension: ``pool`` bounds the wait for a connection, ``connect``
    the TCP and TLS set-up, ``read`` the silence between two reads (a watch's idle
    deadline); httpx2's ``write`` has no aiohttp counterpart. Every socket gets
    ``socket_options`` (TCP keepalive). The session is made on the first request, in the
    event loop that sends it, and closed by :meth:`aclose`.
    """

    def __init__(self, ssl_context: Any, *, max_connections: int,
                 socket_options: list[tuple[int, int, int]] | None = None,
                 trust_env: bool = False) -> None:
        self.ssl_context = ssl_context
        self.trust_env = trust_env
        self.max_connections = max_connections
        self.socket_options = list(socket_options or [])
        self._session: aiohttp.ClientSession | None = None

    def _socket(self, addr_info: Any) -> socket.socket:
        family, type_, proto, _, _ = addr_info
        sock = socket.socket(family=family, type=type_, proto=proto)
        for level, name, value in self.socket_options:
            sock.setsockopt(level, name, value)
        return sock

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self.ssl_context, limit=self.max_connections,
                                             limit_per_host=0, socket_factory=self._socket)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                                  trust_env=self.trust_env, cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        timeouts = request.extensions.get("timeout") or {}
        timeout = aiohttp.ClientTimeout(total=None, connect=timeouts.get("pool"),
                                        sock_connect=timeouts.get("connect"),
                                        sock_read=timeouts.get("read"))
        body = await request.aread()
        try:
            response = await self._session_now().request(
                request.method, str(request.url), headers=request.headers.multi_items(),
                data=body or None, timeout=timeout, allow_redirects=False)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _httpx_error(exc, reading=False) from None
        return httpx2.Response(response.status, headers=response.raw_headers,
                               stream=_AiohttpBody(response),
                               extensions={"http_version": b"HTTP/1.1",
                                           "reason_phrase": (response.reason or "").encode()})

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


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
    inner = AiohttpTransport(_verify(config, trust_env), max_connections=pool_connections,
                             socket_options=keepalive_options(), trust_env=trust_env)
    return AsyncKubeTransport(inner, idle_timeout_s)


def sync_transport(config: SingleConfig | None, *, idle_timeout_s: float = DEFAULT_WATCH_IDLE_TIMEOUT_S,
                   trust_env: bool = True) -> KubeTransport:
    """The transport for a lightkube ``Client`` on ``config`` (see :func:`async_transport`)."""
    inner = httpx2.HTTPTransport(verify=_verify(config, trust_env), trust_env=trust_env,
                                 socket_options=keepalive_options())
    return KubeTransport(inner, idle_timeout_s)


__all__ = ["DEFAULT_POOL_CONNECTIONS", "DEFAULT_WATCH_IDLE_TIMEOUT_S", "AiohttpTransport",
           "AsyncKubeTransport", "KubeTransport",
           "async_transport", "keepalive_options", "prepare_watch", "sync_transport",
           "watch_timeout_for"]
