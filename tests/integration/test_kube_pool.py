"""hami's API client keeps a small connection pool (hami.kubehttp): a burst of requests
shares a few kept-alive connections instead of opening one per concurrent request (the
real client, lightkube over hami's transport, against a real HTTP server)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from aiohttp import web

from hami.kube import Kube
from hami.kubehttp import DEFAULT_POOL_CONNECTIONS

from .support import node


def test_a_burst_of_requests_shares_a_bounded_pool(tmp_path: Path) -> None:
    peers: set[object] = set()
    in_flight = [0, 0]  # now, most

    async def get_node(request: web.Request) -> web.Response:
        peers.add(request.transport.get_extra_info("peername") if request.transport else None)
        in_flight[0] += 1
        in_flight[1] = max(in_flight)
        await asyncio.sleep(0.05)
        in_flight[0] -= 1
        return web.json_response(node(request.match_info["name"]))

    async def scenario() -> None:
        app = web.Application()
        app.router.add_get("/api/v1/nodes/{name}", get_node)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        config = tmp_path / "kubeconfig"
        config.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
        kube = Kube.connect(config, max_inflight=32)
        try:
            for _ in range(2):
                nodes = await asyncio.gather(*(kube.get_node(f"n{i}") for i in range(40)))
                assert [n["metadata"]["name"] for n in nodes] == [f"n{i}" for i in range(40)]
        finally:
            await kube.close()
            await runner.cleanup()

    asyncio.run(scenario())
    assert in_flight[1] == len(peers) == DEFAULT_POOL_CONNECTIONS  # reused, never more
