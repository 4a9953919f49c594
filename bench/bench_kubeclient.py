"""CPU per API request of the scheduler's client (``hami.kube.Kube``: lightkube over
``hami.kubehttp``'s async transport, which sends through aiohttp) against the same client
over httpx2's own transport (httpcore2, same pool bound), on a real API server (etcd and
kube-apiserver from ``hack/k8s``): ``--requests`` merge patches of pods, 16 in flight,
while three watches stay open and decode every change (as in the scheduler).

Usage::

    PYTHONPATH=src python bench/bench_kubeclient.py --requests 800

Prints one JSON line per client and round: ``cpu_ms_per_request`` is this process's CPU
(user + system) over the burst divided by the requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src")]

IN_FLIGHT = 16


def _kube(kubeconfig: Path, client: str) -> Any:
    import httpx2
    from lightkube import AsyncClient, KubeConfig

    from hami.kube import Kube
    from hami.kubehttp import (
        DEFAULT_POOL_CONNECTIONS,
        AsyncKubeTransport,
        _verify,
        async_transport,
        keepalive_options,
    )

    config = KubeConfig.from_file(str(kubeconfig))
    if client == "aiohttp":
        transport = async_transport(config.get())
    else:
        limits = httpx2.Limits(max_connections=DEFAULT_POOL_CONNECTIONS,
                               max_keepalive_connections=DEFAULT_POOL_CONNECTIONS)
        inner = httpx2.AsyncHTTPTransport(verify=_verify(config.get(), False), trust_env=False,
                                          socket_options=keepalive_options(), limits=limits)
        transport = AsyncKubeTransport(inner, 120.0)
    return Kube(AsyncClient(config, field_manager="bench", trust_env=False,
                            timeout=httpx2.Timeout(10.0), transport=transport))


async def _round(kubeconfig: Path, client: str, requests: int) -> dict[str, Any]:
    from hami.kube import _Pod

    kube = _kube(kubeconfig, client)
    names = [f"bench-{i}" for i in range(IN_FLIGHT)]
    for name in names:
        if await kube.get_pod("default", name) is None:
            await kube.client.create(_Pod.from_dict({
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                "spec": {"containers": [{"name": "c", "image": "x"}]}}), namespace="default")
    seen = [0]

    async def watch(kind: str) -> None:
        version = await kube.list(kind, lambda obj: None)
        async for _ in kube.watch(kind, version):
            seen[0] += 1

    watches = [asyncio.create_task(watch(kind)) for kind in ("Pod", "Node", "Pod")]
    await asyncio.sleep(0.5)
    per_pod = requests // IN_FLIGHT

    async def patches(name: str) -> None:
        for j in range(per_pod):
            await kube.patch_pod("default", name, {"metadata": {"annotations": {"n": str(j)}}})

    wall0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(patches(name) for name in names))
    await asyncio.sleep(0.3)  # the last watch events are decoded
    cpu1, wall1 = time.process_time(), time.perf_counter()
    for task in watches:
        task.cancel()
    await asyncio.gather(*watches, return_exceptions=True)
    await kube.close()
    done = per_pod * IN_FLIGHT
    return {"client": client, "requests": done, "watch_events": seen[0],
            "cpu_ms_per_request": round(1000 * (cpu1 - cpu0) / done, 3),
            "seconds": round(wall1 - wall0, 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=800)
    parser.add_argument("--rounds", type=int, default=2, help="A B B A ... pairs")
    args = parser.parse_args()
    from hami.testing.controlplane import ControlPlane

    with ControlPlane(workdir=Path(tempfile.mkdtemp(prefix="hami-bench-client-"))) as cp:
        cp.start(default_scheduler=False)
        order = ["httpx2", "aiohttp", "aiohttp", "httpx2"] * args.rounds
        for client in order[:2 * args.rounds]:
            print(json.dumps(asyncio.run(_round(cp.kubeconfig, client, args.requests))), flush=True)


if __name__ == "__main__":
    main()
