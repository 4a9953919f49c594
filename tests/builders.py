"""Shared test builders: pods and clusters in the shape the core reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def container(name: str = "c", privileged: bool = False, requests: dict[str, Any] | None = None,
              **limits: Any) -> dict[str, Any]:
    """A container whose limits are given as keyword args (``gpu=1, gpumem=4000``)."""
    mapped = {}
    for key, value in limits.items():
        resource = {"gpu": "nvidia.com/gpu", "gpumem": "nvidia.com/gpumem",
                    "gpumem_percentage": "nvidia.com/gpumem-percentage",
                    "gpucores": "nvidia.com/gpucores", "priority": "nvidia.com/priority"}.get(key, key)
        mapped[resource] = value
    c: dict[str, Any] = {"name": name, "image": "busybox", "resources": {"limits": mapped}}
    if requests:
        c["resources"]["requests"] = requests
    if privileged:
        c["securityContext"] = {"privileged": True}
    return c


def pod(name: str = "p", containers: list[dict[str, Any]] | None = None,
        init: list[dict[str, Any]] | None = None, namespace: str = "default",
        annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A v1 Pod as JSON."""
    body: dict[str, Any] = {"containers": containers or [container()], **spec}
    if init:
        body["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                         "annotations": dict(annotations or {})},
            "spec": body}




def cluster_from_case(case: dict[str, Any], config: Any = None) -> Any:
    """A ClusterState holding a field case's nodes and existing allocations."""
    from hami.core.model import ContainerDevice, DeviceInfo
    from hami.core.state import ClusterState

    state = ClusterState(config)
    scenario = case["scenario"]
    for node in scenario["nodes"]:
        devices = [DeviceInfo(uuid=g["id"], index=g["index"], split_count=g["split_count"],
                              memory_mib=g["memory_mb"], cores_percent=g["cores"],
                              type=g["type"], numa=g.get("numa", 0), health=g["health"])
                   for g in node["gpus"]]
        state.ledger.add_node(node["name"], devices)
    for n, alloc in enumerate(scenario.get("existing_allocations") or []):
        if "gpu" not in alloc:
            continue
        slots = alloc.get("used_slots", 1)
        share = [(alloc["used_mem_mb"] // slots, alloc["used_cores"] // slots)] * slots
        share[0] = (alloc["used_mem_mb"] - share[0][0] * (slots - 1),
                    alloc["used_cores"] - share[0][1] * (slots - 1))
        grant = tuple((ContainerDevice(alloc["gpu"], "NVIDIA", m, c),) for m, c in share)
        node_name = alloc.get("node", scenario["nodes"][0]["name"])
        state.charge(f"existing-{n}", node_name, grant, 0, namespace="existing")
    return state


def case_pod(spec: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
    """A v1 Pod from a field case's pod description."""
    def ctr(c: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"name": c["name"], "image": "busybox",
                               "resources": {"limits": dict(c.get("limits") or {})}}
        if c.get("privileged"):
            out["securityContext"] = {"privileged": True}
        return out

    p = pod(spec["name"], [ctr(c) for c in spec["containers"]],
            [ctr(c) for c in spec.get("init_containers") or []] or None,
            namespace=spec.get("namespace", namespace), annotations=spec.get("annotations"))
    return p
