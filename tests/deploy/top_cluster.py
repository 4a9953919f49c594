"""A known cluster state for ``hami top``: two GPU nodes, pods in every membership case."""

from __future__ import annotations

import json
from typing import Any

GPU = "GPU-{node}-{i}"


def register(node: str, n: int, *, mem: int = 16384, split: int = 10) -> str:
    return json.dumps([{"id": GPU.format(node=node, i=i), "index": i, "count": split,
                        "devmem": mem, "devcore": 100, "type": "NVIDIA-Tesla T4",
                        "numa": i // 2, "mode": "hami-core", "health": i != 3}
                       for i in range(n)], separators=(",", ":"))


def node(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"gpu": "on"}, "annotations": annotations}}


def pod(name: str, ns: str, node_name: str, devices: str, *, phase: str = "Running",
        init: int = 0, uid: str | None = None, signed: bool = True) -> dict[str, Any]:
    annotations = {"hami.io/vgpu-node": node_name, "hami.io/vgpu-devices-allocated": devices,
                   "hami.io/bind-phase": "success"}
    if signed:
        annotations["hami.io/vgpu-allocation-signature"] = "v1:k1:c2lnbmF0dXJl"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": uid or f"uid-{ns}-{name}",
                         "annotations": annotations},
            "spec": {"nodeName": node_name, "schedulerName": "hami-scheduler",
                     "initContainers": [{"name": f"i{k}", "image": "x"} for k in range(init)],
                     "containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": phase}}


def objects() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    a, b = "top-a", "top-b"
    nodes = [
        node(a, {"hami.io/node-nvidia-register": register(a, 2),
                 "hami.io/mutex.lock": "2026-01-01T00:00:00Z,team-a,train-0",
                 # its device plugin serves only signed allocations (top-b's does not say)
                 "hami.io/node-trust-unsigned-allocations": "false"}),
        node(b, {"hami.io/node-nvidia-register": register(b, 4, mem=40960),
                 "hami.io/device-cordon": GPU.format(node=b, i=2)}),
        node("top-bad", {"hami.io/node-nvidia-register": "[]"}),
        node("top-cpu", {}),
    ]
    ga0, ga1, gb0, gb1 = (GPU.format(node=a, i=0), GPU.format(node=a, i=1),
                          GPU.format(node=b, i=0), GPU.format(node=b, i=1))
    pods = [
        pod("train-0", "team-a", a, f"{ga0},NVIDIA,4000,30:{ga1},NVIDIA,4000,30:;"),
        # placed by HAMi's scheduler: no signature
        pod("infer-1", "team-a", a, f"{ga0},NVIDIA,2000,0:;", signed=False),
        pod("big", "team-b", b, f"{gb0},NVIDIA,40960,100:;"),
        # init container 6000 MiB, app 1000 MiB on the same GPU: max(init, app) counts.
        pod("with-init", "team-b", b, f"{gb1},NVIDIA,6000,10:;{gb1},NVIDIA,1000,20:;", init=1),
        pod("done", "team-b", b, f"{gb1},NVIDIA,9000,0:;", phase="Succeeded"),
        pod("broken", "team-b", b, f"{gb1},NVIDIA,lots,0:;"),
        pod("elsewhere", "team-c", "top-gone", f"{gb1},NVIDIA,1,1:;"),
    ]
    quotas = [{"apiVersion": "v1", "kind": "ResourceQuota",
               "metadata": {"name": "gpu", "namespace": "team-a"},
               "spec": {"hard": {"limits.nvidia.com/gpumem": "20000",
                                 "limits.nvidia.com/gpucores": "100"}}}]
    return nodes, pods, quotas


def _dev(node_name: str, i: int, *, mem: int, used: tuple[int, int, int],
         pods: list[dict[str, Any]], health: bool = True,
         cordoned: bool = False) -> dict[str, Any]:
    return {"index": i, "uuid": GPU.format(node=node_name, i=i), "type": "NVIDIA-Tesla T4",
            "mode": "hami-core", "numa": i // 2, "health": health, "cordoned": cordoned,
            "memory_mib": {"used": used[1], "total": mem}, "cores": {"used": used[2], "total": 100},
            "tasks": {"used": used[0], "total": 10}, "pods": pods}


def _p(ns: str, name: str, mem: int, cores: int, slots: int = 1,
       signed: bool = True) -> dict[str, Any]:
    return {"namespace": ns, "name": name, "memory_mib": mem, "cores": cores, "slots": slots,
            "signed": signed}


#: What ``hami top -o json`` shows for :func:`objects`.
EXPECTED: dict[str, Any] = {
    "nodes": [
        {"name": "top-a", "gpus": 2,
         "memory_mib": {"used": 10000, "total": 32768}, "cores": {"used": 60, "total": 200},
         "tasks": {"used": 3, "total": 20}, "pods": 2,
         "lock": "2026-01-01T00:00:00Z,team-a,train-0", "strict_signing": "on",
         "devices": [
             _dev("top-a", 0, mem=16384, used=(2, 6000, 30),
                  pods=[_p("team-a", "infer-1", 2000, 0, signed=False), _p("team-a", "train-0", 4000, 30)]),
             _dev("top-a", 1, mem=16384, used=(1, 4000, 30),
                  pods=[_p("team-a", "train-0", 4000, 30)]),
         ]},
        {"name": "top-b", "gpus": 4,
         "memory_mib": {"used": 46960, "total": 163840}, "cores": {"used": 120, "total": 400},
         "tasks": {"used": 2, "total": 40}, "pods": 2, "lock": "", "strict_signing": "unknown",
         "devices": [
             _dev("top-b", 0, mem=40960, used=(1, 40960, 100),
                  pods=[_p("team-b", "big", 40960, 100)]),
             _dev("top-b", 1, mem=40960, used=(1, 6000, 20),
                  pods=[_p("team-b", "with-init", 6000, 20)]),
             _dev("top-b", 2, mem=40960, used=(0, 0, 0), pods=[], cordoned=True),
             _dev("top-b", 3, mem=40960, used=(0, 0, 0), pods=[], health=False),
         ]},
    ],
    "unregistered": [{"name": "top-bad", "reason": "node top-bad: no gpu found on node"}],
    "unplaced": [
        {"namespace": "team-b", "name": "broken", "node": "top-b",
         "reason": "undecodable hami.io/vgpu-devices-allocated"},
        {"namespace": "team-b", "name": "done", "node": "top-b", "reason": "phase Succeeded"},
        {"namespace": "team-c", "name": "elsewhere", "node": "top-gone",
         "reason": "node not registered"},
    ],
    "quotas": [
        {"namespace": "team-a", "memory_mib": {"used": 10000, "limit": 20000},
         "cores": {"used": 60, "limit": 100}},
        {"namespace": "team-b", "memory_mib": {"used": 46960, "limit": None},
         "cores": {"used": 120, "limit": None}},
        {"namespace": "team-c", "memory_mib": {"used": 1, "limit": None},
         "cores": {"used": 1, "limit": None}},
    ],
    "signing": {"signed": 3,
                "unsigned": [{"namespace": "team-a", "name": "infer-1", "node": "top-a"}]},
}
