"""Engine + real aiohttp server on a FakeKube, for integration tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any, TypeVar

from aiohttp.test_utils import TestClient, TestServer

from hami.core.codec import encode_node_devices
from hami.core.model import DeviceInfo
from hami.scheduler.engine import Engine
from hami.scheduler.routes import build_app
from hami.scheduler.settings import SchedulerSettings

from .fake_kube import FakeKube

T = TypeVar("T")

SETTINGS = SchedulerSettings(register_interval=timedelta(hours=1),
                             node_lock_retry_timeout=timedelta(seconds=0.5),
                             identity="test-replica")


def register(node: str, gpus: int = 4, memory_mib: int = 24576, split: int = 10,
             gpu_type: str = "NVIDIA-A10") -> str:
    return encode_node_devices(
        DeviceInfo(uuid=f"GPU-{node}-{i}", index=i, split_count=split, memory_mib=memory_mib,
                   cores_percent=100, type=gpu_type, mode="hami-core", health=True)
        for i in range(gpus))


def node(name: str, gpus: int = 4, **kw: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name},
                         "annotations": {"hami.io/node-nvidia-register": register(name, gpus, **kw)}},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus * 10)}}}


def gpu_pod(name: str, *, gpus: int = 1, memory_mib: int | None = None, cores: int | None = None,
            namespace: str = "default", annotations: dict[str, str] | None = None) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)}
    if memory_mib is not None:
        limits["nvidia.com/gpumem"] = str(memory_mib)
    if cores is not None:
        limits["nvidia.com/gpucores"] = str(cores)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "annotations": dict(annotations or {})},
            "spec": {"schedulerName": "hami-scheduler",
                     "containers": [{"name": "main", "image": "x",
                                     "resources": {"limits": limits}}]},
            "status": {"phase": "Pending"}}


class Harness:
    def __init__(self, kube: FakeKube, engine: Engine, client: TestClient) -> None:
        self.kube, self.engine, self.client = kube, engine, client

    async def post(self, path: str, body: Any) -> Any:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        resp = await self.client.post(path, data=data,
                                      headers={"Content-Type": "application/json"})
        assert resp.status == 200, await resp.text()
        return await resp.json()

    async def filter(self, pod: dict[str, Any], names: list[str]) -> Any:
        return await self.post("/filter", {"Pod": pod, "Nodes": None, "NodeNames": names})

    async def bind(self, pod: dict[str, Any], node: str) -> Any:
        meta = pod["metadata"]
        return await self.post("/bind", {"PodName": meta["name"],
                                         "PodNamespace": meta.get("namespace", "default"),
                                         "PodUID": meta.get("uid", ""), "Node": node})

    async def settle(self) -> None:
        for _ in range(5):
            await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def serving(kube: FakeKube, **overrides: Any) -> AsyncIterator[Harness]:
    settings = replace(SETTINGS, **overrides)
    engine = Engine(settings, kube)
    await engine.start()
    client = TestClient(TestServer(build_app(engine, settings)))
    await client.start_server()
    try:
        yield Harness(kube, engine, client)
    finally:
        await client.close()
        await engine.stop()


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(scenario())


def ledger_snapshot(engine: Engine) -> Any:
    ledger = engine.state.ledger
    return (sorted((e.uid, e.node, e.charges) for e in ledger.pods()),
            {n: ledger.device_usage(n) for n in ledger.node_names()},
            {ns: q for ns, q in engine.state.quota.namespaces().items()
             if (q.memory_limit_mib, q.cores_limit_percent, q.memory_used_mib,
                 q.cores_used_percent) != (None, None, 0, 0)})
