"""Secure metrics (issue 25 §5): the scrape decision of :mod:`hami.metricsauth` with the
API server's reviews replaced at their protocol boundary (TokenReview and
SubjectAccessReview statuses as the API server returns them), and the monitor's HTTPS
listener serving it. The real API server's answers are tests/e2e/test_metrics_secure_e2e.py."""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from hami.metricsauth import (
    CACHE_MAX_ENTRIES,
    MAX_TOKEN_BYTES,
    MetricsGuard,
    VerdictCache,
    access_review_spec,
    bearer_token,
    self_signed_context,
)
from hami.monitor.command import serve_metrics

USER = {"username": "system:serviceaccount:monitoring:prometheus", "uid": "u-1",
        "groups": ["system:serviceaccounts", "system:authenticated"],
        "extra": {"authentication.kubernetes.io/pod-name": ["prometheus-0"]}}


class Api:
    """The API server's answers: ``tokens`` maps a token to its user, ``allowed`` the
    usernames RBAC lets get /metrics. Records every review."""

    def __init__(self, tokens: Mapping[str, Mapping[str, Any]], allowed: set[str]) -> None:
        self.tokens, self.allowed = dict(tokens), set(allowed)
        self.token_reviews: list[str] = []
        self.access_reviews: list[Mapping[str, Any]] = []
        self.fail = False

    def review_token(self, token: str) -> Mapping[str, Any]:
        self.token_reviews.append(token)
        if self.fail:
            raise ConnectionError("apiserver down")
        user = self.tokens.get(token)
        return {"authenticated": True, "user": dict(user)} if user else {
            "authenticated": False, "error": "invalid bearer token"}

    def review_access(self, spec: Mapping[str, Any]) -> Mapping[str, Any]:
        self.access_reviews.append(spec)
        ok = (spec["user"] in self.allowed
              and spec["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"})
        return {"allowed": ok}

    def sync(self) -> Any:
        return (self.review_token, self.review_access)

    def aio(self) -> Any:
        async def token(t: str) -> Mapping[str, Any]:
            return self.review_token(t)

        async def access(s: Mapping[str, Any]) -> Mapping[str, Any]:
            return self.review_access(s)
        return (token, access)


def api() -> Api:
    return Api({"good": USER, "norole": {**USER, "username": "system:serviceaccount:x:y"}},
               {USER["username"]})


@pytest.mark.parametrize(("header", "token"), [
    (None, None), ("", None), ("Bearer", None), ("Bearer ", None), ("Basic abc", None),
    ("Bearer abc", "abc"), ("bearer  abc ", "abc"), ("Bearer a b", None),
    ("Bearer a\x00b", None), ("Bearer \u00e9t\u00e9", None),
    ("Bearer " + "x" * MAX_TOKEN_BYTES, "x" * MAX_TOKEN_BYTES),
    ("Bearer " + "x" * (MAX_TOKEN_BYTES + 1), None),
])
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_access_review_spec_carries_the_whole_identity() -> None:
    spec = access_review_spec(USER)
    assert spec == {"user": USER["username"], "uid": "u-1", "groups": USER["groups"],
                    "extra": USER["extra"],
                    "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}
    assert access_review_spec({"username": "a", "groups": "notalist", "extra": 3}) == {
        "user": "a", "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}


def test_answers_and_the_cache() -> None:
    a, guard = api(), MetricsGuard()
    assert guard.check(None, a.sync()).status == 401
    assert guard.check("Basic Zm9vOmJhcg==", a.sync()).status == 401
    assert a.token_reviews == []  # no review for a missing or malformed token
    assert guard.check("Bearer forged", a.sync()).status == 401
    assert a.access_reviews == []  # not authenticated: no access review
    assert guard.check("Bearer norole", a.sync()).status == 403
    assert guard.check("Bearer good", a.sync()).status == 200
    assert a.access_reviews[-1] == access_review_spec(USER)
    reviews = len(a.token_reviews)
    for header, status in (("Bearer forged", 401), ("Bearer norole", 403),
                           ("Bearer good", 200)):
        assert guard.check(header, a.sync()).status == status
    assert len(a.token_reviews) == reviews  # cached, both ways
    assert guard.refused == 6


def test_cached_verdicts_expire_and_are_bounded() -> None:
    now = [0.0]
    cache = VerdictCache(ttl_s=10.0, max_entries=3, clock=lambda: now[0])
    a, guard = api(), MetricsGuard(cache)
    assert guard.check("Bearer good", a.sync()).status == 200
    a.allowed.clear()  # the RoleBinding is deleted
    now[0] = 9.9
    assert guard.check("Bearer good", a.sync()).status == 200
    now[0] = 10.0
    assert guard.check("Bearer good", a.sync()).status == 403
    for i in range(50):
        guard.check(f"Bearer random-{i}", a.sync())
    assert len(cache) == 3
    assert CACHE_MAX_ENTRIES <= 4096


def test_api_errors_are_503_and_not_cached() -> None:
    a, guard = api(), MetricsGuard()
    a.fail = True
    assert guard.check("Bearer good", a.sync()).status == 503
    a.fail = False
    assert guard.check("Bearer good", a.sync()).status == 200

    def broken(spec: Mapping[str, Any]) -> Mapping[str, Any]:
        raise ValueError("not a status")
    assert MetricsGuard().check("Bearer good", (a.review_token, broken)).status == 503


def test_reviews_in_flight_are_bounded() -> None:
    a, gate, entered = api(), threading.Event(), threading.Semaphore(0)

    def slow(token: str) -> Mapping[str, Any]:
        entered.release()
        gate.wait(10)
        return a.review_token(token)

    guard = MetricsGuard(max_inflight=2, wait_s=0.2)
    results: list[int] = []
    threads = [threading.Thread(target=lambda i=i: results.append(
        guard.check(f"Bearer t{i}", (slow, a.review_access)).status)) for i in range(2)]
    for t in threads:
        t.start()
    assert entered.acquire(timeout=5) and entered.acquire(timeout=5)
    assert guard.check("Bearer good", (slow, a.review_access)).status == 503
    gate.set()
    for t in threads:
        t.join(5)
    assert results == [401, 401]
    assert guard.check("Bearer good", a.sync()).status == 200


def test_async_check_gives_the_same_answers() -> None:
    async def run() -> list[int]:
        a, guard = api(), MetricsGuard()
        out = [(await guard.check_async(h, a.aio())).status
               for h in (None, "Bearer forged", "Bearer norole", "Bearer good", "Bearer good")]
        assert len(a.token_reviews) == 3
        return out
    assert asyncio.run(run()) == [401, 401, 403, 200, 200]


@pytest.fixture(scope="module")
def tls() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    server, ca_pem = self_signed_context(["localhost", "127.0.0.1"])
    client = ssl.create_default_context(cadata=ca_pem.decode())
    return server, client


class _Collector:
    def render(self) -> bytes:
        return b"hami_build_info 1\n"


@pytest.fixture
def monitor(tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> Iterator[tuple[str, Api]]:
    a = api()
    server = serve_metrics(_Collector(), "127.0.0.1", 0, guard=MetricsGuard(),
                           reviewer=a.sync(), ssl_context=tls[0])
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/metrics", a
    finally:
        server.shutdown()
        server.server_close()


def scrape(url: str, context: ssl.SSLContext, header: str | None = None
           ) -> tuple[int, bytes, Mapping[str, str]]:
    req = urllib.request.Request(url, headers={"Authorization": header} if header else {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read(), dict(err.headers)


def test_monitor_listener_speaks_tls_and_asks_first(
        monitor: tuple[str, Api], tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    url, a = monitor
    status, body, headers = scrape(url, tls[1])
    assert (status, headers.get("WWW-Authenticate")) == (401, 'Bearer realm="hami-monitor"')
    assert b"hami_build_info" not in body
    assert scrape(url, tls[1], "Bearer forged")[0] == 401
    assert scrape(url, tls[1], "Bearer norole")[:2] == (403, b"Forbidden\n")
    assert scrape(url, tls[1], "Bearer good")[:2] == (200, b"hami_build_info 1\n")
    # plain HTTP on the TLS port, and a handshake that never comes: refused, server on
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(url.replace("https", "http"), timeout=5)
    import socket

    with socket.create_connection(("127.0.0.1", int(url.split(":")[2].split("/")[0]))) as s:
        s.sendall(b"\x16\x03\x01\x00\xff" + b"\x00" * 10)  # a ClientHello cut short
        time.sleep(0.1)
        assert scrape(url, tls[1], "Bearer good")[0] == 200
    huge = "Bearer " + "x" * (MAX_TOKEN_BYTES + 1)
    assert scrape(url, tls[1], huge)[0] == 401
    assert huge[7:] not in a.token_reviews


def test_a_trickled_tls_handshake_is_cut_at_the_deadline(
        tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    """A peer that sends its ClientHello one byte every 0.3 s (each read within the socket
    timeout) is still cut when the head deadline has passed since the connection."""
    import socket

    from hami.netlimits import ServerLimits

    limits = ServerLimits(header_timeout_s=1.0, body_timeout_s=1.0, max_remote_connections=8)
    server = serve_metrics(_Collector(), "127.0.0.1", 0, limits, guard=MetricsGuard(),
                           reviewer=api().sync(), ssl_context=tls[0])
    try:
        port = server.server_address[1]
        # a record header announcing 512 bytes, then the body's first bytes, slowly
        hello = b"\x16\x03\x01\x02\x00" + b"\x01\x00\x01\xfc\x03\x03" + b"\x00" * 30
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.settimeout(0.3)
            closed = None
            for byte in hello:
                try:
                    s.sendall(bytes([byte]))
                    s.recv(1024)  # an alert or EOF: the server gave up on us
                    closed = time.monotonic() - started
                    break
                except TimeoutError:
                    continue
                except OSError:
                    closed = time.monotonic() - started
                    break
        assert closed is not None and closed < 5.0, closed
        url = f"https://127.0.0.1:{port}/metrics"
        assert scrape(url, tls[1], "Bearer good")[0] == 200
    finally:
        server.shutdown()
        server.server_close()


def test_new_tokens_are_reviewed_at_a_bounded_rate_and_known_scrapers_are_not_held() -> None:
    """A burst of NEW_TOKEN_BURST made-up tokens is reviewed, then 5 a second (the rest:
    503, not cached); a token allowed before is reviewed again when its verdict expires,
    however many made-up tokens came meanwhile."""
    from hami.metricsauth import NEW_TOKEN_BURST

    now = [0.0]
    a = api()
    guard = MetricsGuard(VerdictCache(ttl_s=10.0, clock=lambda: now[0]))
    assert guard.check("Bearer good", a.sync()).status == 200
    answers = [guard.check(f"Bearer made-up-{i}", a.sync()).status for i in range(100)]
    assert answers.count(401) == NEW_TOKEN_BURST - 1
    assert answers.count(503) == 100 - answers.count(401)
    assert len(a.token_reviews) == NEW_TOKEN_BURST          # was 101
    now[0] = 1.0                                            # 5 more new tokens a second
    more = [guard.check(f"Bearer later-{i}", a.sync()).status for i in range(10)]
    assert more.count(401) == 5
    now[0] = 20.0                                           # "good"'s verdict expired
    for i in range(200):
        guard.check(f"Bearer flood-{i}", a.sync())
    assert guard.check("Bearer good", a.sync()).status == 200
    assert guard.check("Bearer norole", a.sync()).status == 503   # new, budget spent
    # another sender's budget is its own: a new token from it is reviewed
    assert guard.check("Bearer norole", a.sync(), "10.0.0.9").status == 403
