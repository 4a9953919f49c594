"""The scheduler's API client sends through aiohttp (hami.kubehttp.AiohttpTransport) and
behaves as httpx2's own transport did: the real client (lightkube over hami's transport)
against a real HTTP server: answers decoded (gzip included), error answers hand their
connection back, a server that is not there is a KubeError with code 0 (no crash), and
every connection has TCP keepalive."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from hami.kube import Kube, KubeError
from hami.kubehttp import DEFAULT_POOL_CONNECTIONS, AiohttpTransport, AsyncKubeTransport

from .support import node


def _kubeconfig(tmp_path: Path, port: int) -> Path:
    config = tmp_path / "kubeconfig"
    config.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return config


@asynccontextmanager
async def _server(app: web.Application) -> AsyncIterator[int]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


def test_requests_go_through_aiohttp_with_auth_and_body(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []

    async def patch_pod(request: web.Request) -> web.Response:
        seen.append({"auth": request.headers.get("Authorization"),
                     "type": request.headers.get("Content-Type"),
                     "body": await request.json(), "ua": request.headers.get("User-Agent")})
        return web.json_response({"kind": "Pod", "apiVersion": "v1",
                                  "metadata": {"name": request.match_info["name"],
                                               "namespace": "ns"}})

    async def scenario() -> None:
        app = web.Application()
        app.router.add_patch("/api/v1/namespaces/ns/pods/{name}", patch_pod)
        async with _server(app) as port:
            kube = Kube.connect(_kubeconfig(tmp_path, port))
            try:
                transport = kube.client._client._client._transport
                assert isinstance(transport, AsyncKubeTransport)
                assert isinstance(transport.inner, AiohttpTransport)
                pod = await kube.patch_pod("ns", "p1", {"metadata": {"labels": {"a": "b"}}})
            finally:
                await kube.close()
        assert pod["metadata"]["name"] == "p1"
        assert seen == [{"auth": "Bearer t", "type": "application/merge-patch+json",
                         "body": {"metadata": {"labels": {"a": "b"}}}, "ua": seen[0]["ua"]}]
        assert "aiohttp" not in (seen[0]["ua"] or "")  # httpx2's request, sent as built

    asyncio.run(scenario())


def test_gzip_answers_are_decoded_and_errors_free_their_connection(tmp_path: Path) -> None:
    peers: set[object] = set()

    async def get_node(request: web.Request) -> web.Response:
        peers.add(request.transport.get_extra_info("peername") if request.transport else None)
        await asyncio.sleep(0.02)
        name = request.match_info["name"]
        if name.startswith("missing"):
            status = {"kind": "Status", "apiVersion": "v1", "code": 404, "status": "Failure",
                      "reason": "NotFound", "message": f"nodes \"{name}\" not found"}
            # exactly the API server's Content-Type (lightkube reads a Status only then)
            return web.Response(status=404, body=json.dumps(status).encode(),
                                headers={"Content-Type": "application/json"})
        body = gzip.compress(json.dumps(node(name)).encode())
        return web.Response(body=body, content_type="application/json",
                            headers={"Content-Encoding": "gzip"})

    async def scenario() -> None:
        app = web.Application()
        app.router.add_get("/api/v1/nodes/{name}", get_node)
        async with _server(app) as port:
            kube = Kube.connect(_kubeconfig(tmp_path, port))
            try:
                for _ in range(3):  # errors leave no connection behind: the pool never runs dry
                    missing = await asyncio.gather(*(kube.get_node(f"missing{i}") for i in range(30)),
                                                   return_exceptions=True)
                    assert all(isinstance(e, KubeError) and e.not_found for e in missing)
                found = await asyncio.gather(*(kube.get_node(f"n{i}") for i in range(30)))
            finally:
                await kube.close()
        assert [n["metadata"]["name"] for n in found] == [f"n{i}" for i in range(30)]
        assert found[0]["metadata"]["annotations"] == node("n0")["metadata"]["annotations"]
        assert len(peers) <= DEFAULT_POOL_CONNECTIONS

    asyncio.run(scenario())


def test_no_server_is_a_kube_error_with_code_0(tmp_path: Path) -> None:
    async def scenario(port: int) -> None:
        kube = Kube.connect(_kubeconfig(tmp_path, port), timeout_s=2.0)
        try:
            with pytest.raises(KubeError) as err:
                await kube.get_node("n1")
            assert err.value.code == 0 and "Connect" in err.value.message
        finally:
            await kube.close()

    # A port bound and never listened on refuses every connection, and stays ours for
    # the whole test (a port closed again could be taken by another process meanwhile).
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        asyncio.run(scenario(sock.getsockname()[1]))


def test_connections_have_tcp_keepalive(tmp_path: Path) -> None:
    sockets: list[socket.socket] = []

    async def get_node(request: web.Request) -> web.Response:
        return web.json_response(node(request.match_info["name"]))

    async def scenario() -> None:
        app = web.Application()
        app.router.add_get("/api/v1/nodes/{name}", get_node)
        async with _server(app) as port:
            kube = Kube.connect(_kubeconfig(tmp_path, port))
            inner = kube.client._client._client._transport.inner
            make = inner._socket

            def spy(addr_info: Any) -> socket.socket:
                sock = make(addr_info)
                sockets.append(sock)
                return sock

            inner._socket = spy
            try:
                await kube.get_node("n1")
                assert len(sockets) == 1
                sock = sockets[0]
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                if hasattr(socket, "TCP_KEEPIDLE"):
                    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
            finally:
                await kube.close()

    asyncio.run(scenario())
