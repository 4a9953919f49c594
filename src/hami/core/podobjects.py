"""Reading the Kubernetes objects the scheduler core is fed (JSON-shaped mappings): a
pod's identity and phase, an object's metadata, and any field of an object that may be
malformed (:func:`mapping_or_empty`, :func:`list_or_empty`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Pod phases after which a pod holds no devices.
TERMINAL_PHASES = ("Succeeded", "Failed")


def mapping_or_empty(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a JSON object (a mapping), else an empty mapping.

    For reading a field of an API object that anyone may have written (a tenant's pod or
    claim, a slice): a missing field (None) or one of the wrong type (a string, a list)
    reads as empty, so ``mapping_or_empty(mapping_or_empty(obj).get("spec")).get("x")``
    never raises. The value itself is returned, not a copy. Never raises.
    """
    return value if isinstance(value, Mapping) else {}


def list_or_empty(value: Any) -> list[Any]:
    """``value`` when it is a JSON array (a ``list``), else a new empty list: the
    :func:`mapping_or_empty` of array fields (a tuple or a string is not an array of the
    API's JSON). The value itself is returned, not a copy. Never raises."""
    return value if isinstance(value, list) else []


def meta_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping_or_empty(obj.get("metadata"))


def pod_uid(pod: Mapping[str, Any]) -> str:
    """The pod's UID, or ``namespace/name`` when it has none yet (offline input)."""
    meta = meta_of(pod)
    return str(meta.get("uid") or f"{meta.get('namespace') or 'default'}/{meta.get('name')}")


def is_sidecar(container: Any) -> bool:
    """True for a restartable init container (``restartPolicy: Always``, Kubernetes'
    native sidecar, KEP-753): it runs for the pod's whole life. The API server accepts no
    other value of an init container's ``restartPolicy``; anything else is ordinary."""
    return isinstance(container, Mapping) and container.get("restartPolicy") == "Always"


def sidecar_positions(pod: Mapping[str, Any]) -> frozenset[int]:
    """Positions (among ``spec.initContainers``, which come first in every per-container
    list) of the pod's sidecars."""
    spec = pod.get("spec")
    init = spec.get("initContainers") if isinstance(spec, Mapping) else None
    if not isinstance(init, list):
        return frozenset()
    return frozenset(i for i, c in enumerate(init) if is_sidecar(c))


def init_containers_done(pod: Mapping[str, Any]) -> bool:
    """True when the pod has init containers and every ordinary one terminated with exit
    code 0 (sidecars keep running, and keep their charge)."""
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    if not statuses:
        return False
    spec = pod.get("spec")
    init = spec.get("initContainers") if isinstance(spec, Mapping) else None
    sidecars = {c.get("name") for c in init or [] if is_sidecar(c)}
    for status in statuses:
        if isinstance(status, Mapping) and status.get("name") in sidecars:
            continue
        terminated = (status.get("state") or {}).get("terminated")
        if not terminated or terminated.get("exitCode") != 0:
            return False
    return True


__all__ = ["TERMINAL_PHASES", "init_containers_done", "is_sidecar", "list_or_empty",
           "mapping_or_empty", "meta_of", "pod_uid", "sidecar_positions"]
