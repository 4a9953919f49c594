"""Reading the Kubernetes objects the scheduler core is fed (JSON-shaped mappings): a
pod's identity and phase, an object's metadata.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Pod phases after which a pod holds no devices.
TERMINAL_PHASES = ("Succeeded", "Failed")


def meta_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def pod_uid(pod: Mapping[str, Any]) -> str:
    """The pod's UID, or ``namespace/name`` when it has none yet (offline input)."""
    meta = meta_of(pod)
    return str(meta.get("uid") or f"{meta.get('namespace') or 'default'}/{meta.get('name')}")


def init_containers_done(pod: Mapping[str, Any]) -> bool:
    """True when the pod has init containers and every one terminated with exit code 0."""
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    if not statuses:
        return False
    for status in statuses:
        terminated = (status.get("state") or {}).get("terminated")
        if not terminated or terminated.get("exitCode") != 0:
            return False
    return True


__all__ = ["TERMINAL_PHASES", "init_containers_done", "meta_of", "pod_uid"]
