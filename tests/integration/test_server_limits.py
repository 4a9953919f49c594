"""The scheduler's listeners under hostile load (issue 12 §5), through ``serve()``'s real
sockets: request heads and bodies have deadlines, idle connections close, the TLS
handshake has the same deadline, remote peers have a connection cap that loopback
(kube-scheduler) never hits, and a large AdmissionReview does not hold ``/filter`` up."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import threading
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from .fake_kube import FakeKube
from .listening import closed_after, serving_ports
from .support import SETTINGS, gpu_pod, node, run, serving
from .test_extender_identity import _non_loopback_address

DEADLINE_S = 1.0
#: Generous: a loaded 2-core CI box may be slow to notice, never early.
SLACK_S = 10.0  # (below the 30 s header deadline the remote-cap test tells apart)


@contextlib.asynccontextmanager
async def scheduler(kube: FakeKube | None = None, **overrides: Any) -> AsyncIterator[int]:
    """``serve()`` on a free port (metrics off) with ``overrides``; yields the port."""
    async with serving_ports(kube, **overrides) as ports:
        yield ports["http"]


LIMITS = {"http_header_timeout": timedelta(seconds=DEADLINE_S),
          "http_body_timeout": timedelta(seconds=DEADLINE_S)}


def test_header_trickle_raw_connection_and_idle_keepalive_are_closed() -> None:
    async def scenario() -> None:
        async with scheduler(**LIMITS) as port:
            async def trickle() -> float:
                started = time.monotonic()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\n")

                async def drip() -> None:
                    with contextlib.suppress(ConnectionError):
                        for _ in range(100):
                            writer.write(b"X")  # one header byte every 0.2 s, never done
                            await writer.drain()
                            await asyncio.sleep(0.2)

                dripping = asyncio.create_task(drip())
                try:
                    return await closed_after(reader, DEADLINE_S + SLACK_S, started)
                finally:
                    dripping.cancel()
                    writer.close()

            async def silent() -> float:
                started = time.monotonic()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                try:
                    return await closed_after(reader, DEADLINE_S + SLACK_S, started)
                finally:
                    writer.close()

            async def idle_after_response() -> float:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                started = time.monotonic()  # the idle timer starts after the answer
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200"), head
                assert await reader.readexactly(2) == b"ok"
                try:
                    return await closed_after(reader, DEADLINE_S + SLACK_S, started)
                finally:
                    writer.close()

            times = await asyncio.gather(trickle(), silent(), idle_after_response())
            trickle_s, silent_s, idle_s = times
            print(f"closed after: header trickle {trickle_s:.2f} s, silent {silent_s:.2f} s, "
                  f"idle keep-alive {idle_s:.2f} s")
            for seconds in times:
                assert seconds >= DEADLINE_S * 0.9

    run(scenario)


#: Far below aiohttp's own 10 s drain of a body its route did not read, which held such a
#: trickle before the drain got the body deadline.
BODY_BOUND_S = 8.0


@pytest.mark.parametrize("path", ["/webhook", "/healthz", "/nowhere"])
def test_body_trickle_is_cut_at_the_body_deadline(path: str) -> None:
    """Whether or not the route reads bodies (``/healthz`` answers 405, ``/nowhere`` 404
    before the body; aiohttp then drains the rest)."""

    async def scenario() -> None:
        async with scheduler(**LIMITS) as port:
            started = time.monotonic()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                         b"\r\nContent-Length: 1000\r\n\r\n{" % path.encode())

            async def drip() -> None:
                with contextlib.suppress(ConnectionError):
                    for _ in range(100):
                        writer.write(b" ")
                        await writer.drain()
                        await asyncio.sleep(0.2)

            dripping = asyncio.create_task(drip())
            try:
                seconds = await closed_after(reader, BODY_BOUND_S, started)
            finally:
                dripping.cancel()
                writer.close()
            print(f"{path}: body trickle closed after {seconds:.2f} s")
            assert seconds >= DEADLINE_S * 0.9

    run(scenario)


def test_tls_handshake_has_the_header_deadline(tmp_path: Path) -> None:
    from hami.testing.pki import CertificateAuthority

    ca = CertificateAuthority.create("limits-ca")
    cert_file, key_file = ca.issue("hami", ip_sans=["127.0.0.1"], server=True).write(
        tmp_path, "serving")

    async def scenario() -> None:
        async with scheduler(cert_file=str(cert_file), key_file=str(key_file), **LIMITS) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)  # no ClientHello
            try:
                seconds = await closed_after(reader, DEADLINE_S + SLACK_S)
            finally:
                writer.close()
            print(f"TCP connection without TLS handshake closed after {seconds:.2f} s")
            context = ssl.create_default_context(cadata=ca.cert_pem.decode()
                                                 if isinstance(ca.cert_pem, bytes) else ca.cert_pem)
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert (await reader.read()).startswith(b"HTTP/1.1 200")
            writer.close()

    run(scenario)


def test_remote_connection_cap_never_starves_loopback() -> None:
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to call from")
    cap = 3

    async def scenario() -> None:
        kube = FakeKube()
        kube.put("Node", node("n1"))
        pod = kube.put("Pod", gpu_pod("p", memory_mib=1000))
        async with scheduler(kube, http_bind="0.0.0.0:0", http_max_connections=cap,
                             http_header_timeout=timedelta(seconds=30)) as port:
            remote = [await asyncio.open_connection(address, port) for _ in range(cap)]
            over_reader, over_writer = await asyncio.open_connection(address, port)
            seconds = await closed_after(over_reader, SLACK_S)
            over_writer.close()
            print(f"connection over the remote cap closed after {seconds:.3f} s")
            # loopback peers pass beyond the cap: idle ones, then kube-scheduler's /filter
            local = [await asyncio.open_connection("127.0.0.1", port) for _ in range(cap + 2)]
            body = json.dumps({"Pod": pod, "NodeNames": ["n1"]}).encode()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            answer = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
            assert b'"NodeNames":["n1"]' in answer, answer
            # a remote slot freed is a slot taken again
            remote[0][1].close()

            async def healthz() -> bytes:
                again_reader, again_writer = await asyncio.open_connection(address, port)
                again_writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                try:
                    return await asyncio.wait_for(again_reader.read(), 10)
                except ConnectionError:
                    return b""
                finally:
                    again_writer.close()

            # until the server has seen the close (a connection before that is over the
            # cap and closed unanswered)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + SLACK_S
            while not (answer := await healthz()) and loop.time() < deadline:
                await asyncio.sleep(0.1)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
            for _, w in remote[1:] + local:
                w.close()

    run(scenario)


def test_large_admission_review_does_not_hold_up_filter() -> None:
    """The webhook decision for a ~900 KB pod runs while ``/filter`` is answered: the
    filter's answer arrives before the admission has finished."""
    containers = [{"name": f"c{i}", "image": "x",
                   "env": [{"name": f"E{j}", "value": "v" * 8} for j in range(3)],
                   "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100"}}}
                  for i in range(4000)]
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "big", "kind": {"kind": "Pod"}, "operation": "CREATE",
                          "object": {"apiVersion": "v1", "kind": "Pod",
                                     "metadata": {"name": "big", "namespace": "default"},
                                     "spec": {"containers": containers}}}}
    body = json.dumps(review).encode()
    assert 700_000 < len(body) < SETTINGS.max_body_bytes

    async def scenario() -> None:
        kube = FakeKube()
        kube.put("Node", node("n1"))
        async with serving(kube) as h:
            pod = kube.put("Pod", gpu_pod("small", memory_mib=1000))
            began, ended, filtered = threading.Event(), threading.Event(), threading.Event()
            admit = h.engine.admit

            def timed_admit(raw: bytes) -> Any:
                began.set()
                try:
                    # the decision does not end before /filter has answered, unless /filter
                    # waits for it (then it ends after 60 s, and the assertion below fails):
                    # on a loaded machine a fast decision must not pass for a blocking one
                    filtered.wait(60)
                    return admit(raw)
                finally:
                    ended.set()

            h.engine.admit = timed_admit  # type: ignore[method-assign]
            webhook = asyncio.create_task(h.post("/webhook", body))
            while not began.is_set():
                await asyncio.sleep(0.001)
            t0 = time.monotonic()
            result = await h.filter(pod, ["n1"])
            filter_s = time.monotonic() - t0
            admission_running = not ended.is_set()
            filtered.set()
            answer = await webhook
            total_s = time.monotonic() - t0
            print(f"/filter answered in {filter_s * 1000:.1f} ms while a {len(body) // 1024} KB "
                  f"AdmissionReview was decided ({total_s:.2f} s)")
            assert result["NodeNames"] == ["n1"], result
            assert answer["response"]["allowed"] is True and answer["response"]["uid"] == "big"
            assert admission_running, "/filter waited for the admission to finish"

    run(scenario)
