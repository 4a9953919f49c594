"""Secure metrics serving: who may scrape ``/metrics``, decided by the API server.

The scheme is Kubernetes' own for component metrics (kube-apiserver's delegated
authentication and authorization, controller-runtime's ``WithAuthenticationAndAuthorization``
metrics filter): the scraper presents a bearer token (``Authorization: Bearer <token>``,
what Prometheus sends with ``bearerTokenFile`` or ``authorization.credentials``); the
server asks the API server who it is with a TokenReview (``authentication.k8s.io/v1``)
and whether that user may ``get`` the non-resource URL ``/metrics`` with a
SubjectAccessReview (``authorization.k8s.io/v1``). The answers:

* no token, a malformed one, one over :data:`MAX_TOKEN_BYTES`, or one the API server does
  not authenticate: **401** (``WWW-Authenticate: Bearer``);
* an authenticated user without RBAC for ``get`` on ``/metrics``: **403**;
* the API server did not answer, too many reviews were in flight, or too many tokens not
  allowed before asked for one (:data:`NEW_TOKEN_REVIEWS_PER_S`): **503**, not cached;
* otherwise the series.

Both reviews' verdicts are cached for :data:`CACHE_TTL_S` seconds (the API server's
delegating authenticator and authorizer cache theirs for 10 s by default) in a bounded
LRU map keyed by the token's SHA-256 (the token itself is never kept), and at most
:data:`MAX_INFLIGHT_REVIEWS` reviews run at once, so random tokens cannot turn one
scrape port into a flood of requests on the API server nor starve the component's own
API calls. :class:`MetricsGuard` holds that logic for the scheduler (asyncio) and the
monitor (threads); the API calls are the API layer's (``hami.kube.Kube`` and
``hami.deviceplugin.kube.KubeApi``: ``review_token``, ``review_access``).

The serving certificate is a file pair (the chart gives the scheduler the webhook's
pair) or, with none, a self-signed one made at start-up (:func:`self_signed_context`,
as controller-runtime does without a certificate directory).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hami.tlsfiles import pem_paths

log = logging.getLogger("hami.metricsauth")

#: Longest bearer token accepted (bytes of its text); longer ones get 401 without a
#: review. Service-account tokens are about 1 KiB, OIDC ID tokens a few KiB.
MAX_TOKEN_BYTES = 8192
#: Seconds a review's verdict (allowed or refused) is reused for the same token.
CACHE_TTL_S = 10.0
#: Most tokens whose verdict is cached; the least recently used one goes first.
CACHE_MAX_ENTRIES = 1024
#: Most TokenReview + SubjectAccessReview rounds in flight at once; a scrape waits at
#: most :data:`REVIEW_WAIT_S` seconds for a slot, else 503.
MAX_INFLIGHT_REVIEWS = 4
REVIEW_WAIT_S = 5.0

#: Reviews of tokens not allowed here before, per second and peer address at most after a
#: burst of :data:`NEW_TOKEN_BURST` (beyond: 503, nothing asked): made-up tokens cost the
#: API server (and the component's own share of its priority and fairness) at most this
#: per sender, and one sender's flood does not hold another's new token (Prometheus after
#: a restart or a token rotation). A token allowed before is reviewed again whenever its
#: verdict expires, whatever the flood; at most :data:`CACHE_MAX_ENTRIES` peers are
#: tracked (the least recently seen is forgotten).
NEW_TOKEN_REVIEWS_PER_S = 5.0
NEW_TOKEN_BURST = 20

#: The ``--metrics-secure`` flag's help (scheduler and monitor).
SECURE_HELP = ("serve /metrics over HTTPS to scrapers the API server authenticates "
               "(TokenReview) and authorizes for get on the non-resource URL /metrics "
               "(SubjectAccessReview): no token 401, no such role 403")

#: The request the scraper must be allowed (non-resource URL, RBAC ``nonResourceURLs``).
METRICS_PATH, METRICS_VERB = "/metrics", "get"


@dataclass(frozen=True, slots=True)
class Verdict:
    """An HTTP answer to a scrape: ``status`` 200, 401, 403 or 503, and a short reason
    (sent as the body of a refusal; it never contains the token)."""

    status: int
    reason: str

    @property
    def allowed(self) -> bool:
        return self.status == 200


UNAUTHENTICATED = Verdict(401, "Unauthorized")
FORBIDDEN = Verdict(403, "Forbidden")
ALLOWED = Verdict(200, "OK")
TOO_MANY_NEW = Verdict(503, "too many new tokens to review; retry later")


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value (RFC 6750 §2.1);
    None when the header is missing, of another scheme, empty, over
    :data:`MAX_TOKEN_BYTES` or not a single printable ASCII word."""
    if not header or len(header) > MAX_TOKEN_BYTES + 16:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN_BYTES:
        return None
    if not token.isascii() or not token.isprintable() or " " in token:
        return None
    return token


def access_review_spec(user: Mapping[str, Any], path: str = METRICS_PATH,
                       verb: str = METRICS_VERB) -> dict[str, Any]:
    """The ``spec`` of a SubjectAccessReview asking whether the user a TokenReview
    returned (its ``status.user``: username, uid, groups, extra) may ``verb`` the
    non-resource URL ``path`` (authorization.k8s.io/v1)."""
    spec: dict[str, Any] = {"user": str(user.get("username") or ""),
                            "nonResourceAttributes": {"path": path, "verb": verb}}
    if user.get("uid"):
        spec["uid"] = str(user["uid"])
    groups = user.get("groups")
    if isinstance(groups, list) and groups:
        spec["groups"] = [str(g) for g in groups]
    extra = user.get("extra")
    if isinstance(extra, Mapping) and extra:
        spec["extra"] = {str(k): [str(v) for v in vs] for k, vs in extra.items()
                         if isinstance(vs, list)}
    return spec


def token_verdict(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The authenticated user of a TokenReview ``status``; None when not authenticated
    (or when the status names no user)."""
    user = status.get("user")
    if status.get("authenticated") is True and isinstance(user, Mapping) \
            and user.get("username"):
        return user
    return None


class VerdictCache:
    """Verdicts by token digest, each for ``ttl_s`` seconds, at most ``max_entries``
    (least recently used evicted first). Thread-safe; ``clock`` in seconds."""

    def __init__(self, ttl_s: float = CACHE_TTL_S, max_entries: int = CACHE_MAX_ENTRIES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.max_entries, self.clock = ttl_s, max_entries, clock
        self._entries: OrderedDict[bytes, tuple[float, Verdict]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> Verdict | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry[0] <= self.clock():
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return entry[1]

    def put(self, key: bytes, verdict: Verdict) -> None:
        with self._lock:
            self._entries[key] = (self.clock() + self.ttl_s, verdict)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)


#: ``review_token(token) -> TokenReview status``; ``review_access(spec) -> SAR status``
#: (plain dicts); both raise on a failed API call.
SyncReviewer = tuple[Callable[[str], Mapping[str, Any]],
                     Callable[[Mapping[str, Any]], Mapping[str, Any]]]
AsyncReviewer = tuple[Callable[[str], Awaitable[Mapping[str, Any]]],
                      Callable[[Mapping[str, Any]], Awaitable[Mapping[str, Any]]]]


class MetricsGuard:
    """Decides each scrape (see the module doc); one per listener.

    ``cache``: the verdict cache (a fresh :class:`VerdictCache` by default). Counters
    ``reviews`` (TokenReviews sent), ``refused`` (401/403/503 answers) and ``failures``
    (reviews that failed: 503) are for tests and logs.
    """

    def __init__(self, cache: VerdictCache | None = None, *,
                 max_inflight: int = MAX_INFLIGHT_REVIEWS, wait_s: float = REVIEW_WAIT_S,
                 path: str = METRICS_PATH, new_per_s: float = NEW_TOKEN_REVIEWS_PER_S,
                 new_burst: int = NEW_TOKEN_BURST) -> None:
        self.cache = cache if cache is not None else VerdictCache()
        self.path, self.wait_s = path, wait_s
        self._new_per_s, self._new_burst = new_per_s, float(new_burst)
        self._budgets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # peer -> left, at
        self._allowed_before: OrderedDict[bytes, None] = OrderedDict()
        self._rate_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_inflight)
        self._max_inflight = max_inflight
        self._async_slots: asyncio.Semaphore | None = None
        self.reviews = 0
        self.refused = 0
        self.failures = 0

    @staticmethod
    def _key(token: str) -> bytes:
        return hashlib.sha256(token.encode()).digest()

    def _may_review(self, key: bytes, peer: str) -> bool:
        """True when ``key``'s token may be reviewed now: it was allowed before, or the
        peer's budget of new tokens (:data:`NEW_TOKEN_REVIEWS_PER_S`) has one left
        (taken)."""
        with self._rate_lock:
            if key in self._allowed_before:
                self._allowed_before.move_to_end(key)
                return True
            now = self.cache.clock()
            left, at = self._budgets.pop(peer, (self._new_burst, now))
            left = min(self._new_burst, left + (now - at) * self._new_per_s)
            allowed = left >= 1
            self._budgets[peer] = (left - 1 if allowed else left, now)
            while len(self._budgets) > self.cache.max_entries:
                self._budgets.popitem(last=False)
            return allowed

    def _done(self, key: bytes | None, verdict: Verdict) -> Verdict:
        if key is not None and verdict.status in (200, 401, 403):
            self.cache.put(key, verdict)
        if key is not None and verdict.allowed:
            with self._rate_lock:
                self._allowed_before[key] = None
                self._allowed_before.move_to_end(key)
                while len(self._allowed_before) > self.cache.max_entries:
                    self._allowed_before.popitem(last=False)
        if not verdict.allowed:
            self.refused += 1
        return verdict

    def _first(self, header: str | None) -> tuple[Verdict | None, str, bytes]:
        token = bearer_token(header)
        if token is None:
            return UNAUTHENTICATED, "", b""
        key = self._key(token)
        return self.cache.get(key), token, key

    def _after_token(self, status: Mapping[str, Any]) -> dict[str, Any] | None:
        self.reviews += 1
        user = token_verdict(status)
        return None if user is None else access_review_spec(user, self.path)

    def _unavailable(self, exc: BaseException) -> Verdict:
        self.failures += 1
        if self.failures == 1 or self.failures % 100 == 0:  # one line per 100, not a flood
            log.warning("metrics authorization unavailable (%d so far): %s: %s",
                        self.failures, type(exc).__name__, str(exc)[:500])
        return Verdict(503, "authorization unavailable")

    def check(self, header: str | None, reviewer: SyncReviewer, peer: str = "") -> Verdict:
        """The verdict for one scrape with ``Authorization`` value ``header`` from the
        address ``peer``, asking the API server through ``reviewer`` (blocking) when the
        cache has none. Never raises."""
        cached, token, key = self._first(header)
        if cached is not None:
            return self._done(None, cached)
        if not self._may_review(key, peer):
            return self._done(None, TOO_MANY_NEW)
        if not self._slots.acquire(timeout=self.wait_s):
            return self._done(None, Verdict(503, "too many reviews in flight"))
        try:
            spec = self._after_token(reviewer[0](token))
            if spec is None:
                return self._done(key, UNAUTHENTICATED)
            allowed = reviewer[1](spec).get("allowed") is True
        except Exception as exc:  # noqa: BLE001 - any failure is a 503, never a crash
            return self._done(None, self._unavailable(exc))
        finally:
            self._slots.release()
        return self._done(key, ALLOWED if allowed else FORBIDDEN)

    async def check_async(self, header: str | None, reviewer: AsyncReviewer,
                          peer: str = "") -> Verdict:
        """:meth:`check` for an asyncio server (``reviewer``'s calls are awaited)."""
        cached, token, key = self._first(header)
        if cached is not None:
            return self._done(None, cached)
        if not self._may_review(key, peer):
            return self._done(None, TOO_MANY_NEW)
        if self._async_slots is None:
            self._async_slots = asyncio.Semaphore(self._max_inflight)
        try:
            async with asyncio.timeout(self.wait_s):
                await self._async_slots.acquire()
        except TimeoutError:
            return self._done(None, Verdict(503, "too many reviews in flight"))
        try:
            spec = self._after_token(await reviewer[0](token))
            if spec is None:
                return self._done(key, UNAUTHENTICATED)
            allowed = (await reviewer[1](spec)).get("allowed") is True
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure is a 503, never a crash
            return self._done(None, self._unavailable(exc))
        finally:
            self._async_slots.release()
        return self._done(key, ALLOWED if allowed else FORBIDDEN)


def server_context() -> ssl.SSLContext:
    """A TLS server context, TLS 1.2 or newer, no certificate loaded yet."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def file_context(cert_file: str | Path, key_file: str | Path) -> ssl.SSLContext:
    """A server context serving the PEM pair ``cert_file``/``key_file``.

    Raises:
        OSError, ssl.SSLError: a file is missing or not a matching PEM pair.
    """
    context = server_context()
    context.load_cert_chain(str(cert_file), str(key_file))
    return context


def self_signed_context(hosts: list[str] | None = None) -> tuple[ssl.SSLContext, bytes]:
    """A server context with a new self-signed CA and serving certificate for ``hosts``
    (default: this host's name, ``localhost``, ``127.0.0.1``; ECDSA P-256, made with
    ``cryptography`` by :func:`hami.certgen.generate`), and the CA's PEM (for a client
    that wants to verify). The key only passes through anonymous memory files
    (:func:`hami.tlsfiles.pem_paths`; ``ssl`` loads pairs from paths), closed before this
    returns, so a read-only root file system with no temporary directory is fine."""
    from hami.certgen import generate

    bundle = generate(hosts or [socket.gethostname(), "localhost", "127.0.0.1"],
                      validity_days=365)
    context = server_context()
    with pem_paths(bundle.tls_crt, bundle.tls_key) as (cert, key):
        context.load_cert_chain(cert, key)
    return context, bundle.ca_crt


__all__ = ["ALLOWED", "CACHE_MAX_ENTRIES", "CACHE_TTL_S", "FORBIDDEN", "MAX_INFLIGHT_REVIEWS",
           "MAX_TOKEN_BYTES", "METRICS_PATH", "METRICS_VERB", "SECURE_HELP", "UNAUTHENTICATED",
           "MetricsGuard", "Verdict", "VerdictCache", "access_review_spec", "bearer_token",
           "file_context", "self_signed_context", "server_context", "token_verdict"]
