"""Shared test builders: pods and clusters in the shape the core reads."""

from __future__ import annotations

from typing import Any


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
