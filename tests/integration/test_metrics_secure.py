"""``hami scheduler --metrics-secure`` through ``serve()``'s real listeners (issue 25 §5):
``/metrics`` speaks HTTPS (self-signed, or the given pair) and answers 401, 403, 503 or
the series as the API server's TokenReview and SubjectAccessReview say; the reviews are
replaced at the API layer's boundary (``review_token``/``review_access``). The real API
server's answers are tests/e2e/test_metrics_secure_e2e.py."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hami.core.config import ConfigError
from hami.kube import KubeError

from .fake_kube import FakeKube
from .support import SETTINGS, run
from .test_extender_http import scheduler as serving

READER = "system:serviceaccount:monitoring:prometheus"


class ReviewingKube(FakeKube):
    """FakeKube plus the API server's two reviews: token ``good`` is ``READER``, who may
    get /metrics; ``norole`` someone who may not; ``down`` makes the API fail."""

    def __init__(self) -> None:
        super().__init__()
        self.reviews: list[str] = []

    async def review_token(self, token: str) -> dict[str, Any]:
        self.reviews.append(token)
        if token == "down":
            raise KubeError(0, "connection refused")
        users = {"good": READER, "norole": "system:serviceaccount:tenant:default"}
        if token not in users:
            return {"authenticated": False, "error": "invalid bearer token"}
        return {"authenticated": True, "user": {"username": users[token],
                                                "groups": ["system:authenticated"]}}

    async def review_access(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        ok = spec["user"] == READER and spec["nonResourceAttributes"] == {
            "path": "/metrics", "verb": "get"}
        return {"allowed": ok}


@contextlib.asynccontextmanager
async def scheduler(kube: FakeKube, **overrides: Any) -> AsyncIterator[int]:
    """``serve()`` with its metrics listener on a free port; yields that port."""
    async with serving(kube, metrics_bind_address="127.0.0.1:0", **overrides) as ports:
        yield ports["metrics"]


def scrape(url: str, token: str | None, context: ssl.SSLContext | None
           ) -> tuple[int, str, Mapping[str, str]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=10, context=context) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(), dict(err.headers)


def insecure() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    return ctx


def test_plain_metrics_answer_everyone() -> None:
    """The state before (and without the flag): any scrape gets the series."""
    async def scenario() -> list[int]:
        async with scheduler(ReviewingKube()) as port:
            url = f"http://127.0.0.1:{port}/metrics"
            return [(await asyncio.to_thread(scrape, url, t, None))[0]
                    for t in (None, "forged", "norole", "good")]
    assert run(scenario) == [200, 200, 200, 200]


def test_secure_metrics_self_signed() -> None:
    async def scenario() -> None:
        kube = ReviewingKube()
        async with scheduler(kube, metrics_secure=True) as port:
            url = f"https://127.0.0.1:{port}/metrics"
            out = {t: await asyncio.to_thread(scrape, url, t, insecure())
                   for t in (None, "forged", "norole", "down", "good")}
            assert {t: s for t, (s, _, _) in out.items()} == {
                None: 401, "forged": 401, "norole": 403, "down": 503, "good": 200}
            assert out[None][2]["WWW-Authenticate"] == 'Bearer realm="hami-scheduler"'
            assert "hami_build_info" in out["good"][1]
            assert all("hami_build_info" not in b for s, b, _ in out.values() if s != 200)
            # cached: no second review of the same tokens within 10 s; 503 is not cached
            before = len(kube.reviews)
            for t in ("forged", "norole", "good"):
                await asyncio.to_thread(scrape, url, t, insecure())
            assert len(kube.reviews) == before
            with pytest.raises((urllib.error.URLError, ConnectionError)):
                await asyncio.to_thread(urllib.request.urlopen,
                                        url.replace("https:", "http:"), None, 5)
            assert (await asyncio.to_thread(scrape, url, "good", insecure()))[0] == 200
    run(scenario)


def test_secure_metrics_with_a_certificate_pair(tmp_path: Path) -> None:
    from hami.testing.pki import CertificateAuthority

    ca = CertificateAuthority.create("metrics-ca")
    cert, key = ca.issue("hami", ip_sans=["127.0.0.1"], server=True).write(tmp_path, "m")
    verify = ssl.create_default_context(cadata=ca.cert_pem.decode())

    async def scenario() -> None:
        async with scheduler(ReviewingKube(), metrics_secure=True, metrics_cert_file=str(cert),
                             metrics_key_file=str(key)) as port:
            url = f"https://127.0.0.1:{port}/metrics"
            assert (await asyncio.to_thread(scrape, url, "good", verify))[0] == 200
            assert (await asyncio.to_thread(scrape, url, "norole", verify))[0] == 403
    run(scenario)


@pytest.mark.parametrize("listener", ["http", "metrics"])
def test_a_rotated_certificate_is_served_without_a_restart(tmp_path: Path, listener: str
                                                           ) -> None:
    """The webhook/extender pair (``--cert-file``) and the metrics pair, each mounted from
    a Secret the kubelet updates: new connections get the renewed certificate."""
    from hami.testing.pki import CertificateAuthority
    from tests.unit.test_tlsfiles import mount_secret, verifies, wait_until_verifies

    old, new = CertificateAuthority.create("old"), CertificateAuthority.create("new")
    crt, key = mount_secret(tmp_path / "tls", old.issue("hami", ip_sans=["127.0.0.1"],
                                                       server=True))
    flags = ({"cert_file": str(crt), "key_file": str(key)} if listener == "http" else
             {"metrics_bind_address": "127.0.0.1:0", "metrics_secure": True,
              "metrics_cert_file": str(crt), "metrics_key_file": str(key)})

    async def scenario() -> None:
        async with serving(ReviewingKube(), **flags) as ports:
            port = ports[listener]
            assert await asyncio.to_thread(verifies, port, old)
            mount_secret(tmp_path / "tls", new.issue("hami", ip_sans=["127.0.0.1"],
                                                     server=True))
            await asyncio.to_thread(wait_until_verifies, port, new)
            assert not await asyncio.to_thread(verifies, port, old)
    run(scenario)


@pytest.mark.parametrize("overrides", [
    {"metrics_secure": True, "metrics_cert_file": "/a"},
    {"metrics_cert_file": "/a", "metrics_key_file": "/b"},
])
def test_bad_flag_combinations(overrides: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="--metrics-cert-file"):
        replace(SETTINGS, **overrides).validate()


def _scrape_from(source: str, port: int, token: str) -> int:
    """A scrape of ``/metrics`` with ``token`` sent from the local address ``source``."""
    import http.client

    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=insecure(),
                                       source_address=(source, 0))
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"})
        return conn.getresponse().status
    finally:
        conn.close()


def test_made_up_tokens_cannot_flood_the_api_server() -> None:
    """Anyone who reaches the port may send made-up tokens: each cost a TokenReview (60 of
    60 before); now at most a burst of 20 and 5 a second more per sender are reviewed
    (the rest get 503), and another sender's new token is not held by that flood."""
    from hami.metricsauth import NEW_TOKEN_BURST, NEW_TOKEN_REVIEWS_PER_S

    async def scenario() -> None:
        kube = ReviewingKube()
        async with scheduler(kube, metrics_secure=True) as port:
            started = asyncio.get_running_loop().time()
            answers = [await asyncio.to_thread(_scrape_from, "127.0.0.1", port, f"made-up-{i}")
                       for i in range(60)]
            elapsed = asyncio.get_running_loop().time() - started
            made_up = [t for t in kube.reviews if t.startswith("made-up-")]
            assert len(made_up) <= NEW_TOKEN_BURST + NEW_TOKEN_REVIEWS_PER_S * elapsed + 1, (
                len(made_up), elapsed)
            assert set(answers) <= {401, 503} and answers.count(401) == len(made_up)
            # Prometheus, elsewhere, with a token never seen (after a restart or rotation)
            assert await asyncio.to_thread(_scrape_from, "127.0.0.2", port, "good") == 200
    run(scenario)
