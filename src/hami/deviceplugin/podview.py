"""The pod as the device plugin sees it, and the kubelet's device IDs. Pure.

:class:`PodView` is what every node component reads of a Pod (the Kubernetes client
builds it, :mod:`hami.deviceplugin.kubewatch`); the annotation names are HAMi v2.10's;
:func:`decode_entries` reads the scheduler's ``hami.io/vgpu-devices-to-allocate``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from hami.core.codec import CodecError, decode_pod_devices
from hami.core.model import PodSingleDevice

DEVICES_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
BIND_PHASE = "hami.io/bind-phase"
BIND_TIME = "hami.io/bind-time"
VGPU_NODE = "hami.io/vgpu-node"
NODE_LOCK = "hami.io/mutex.lock"


class AllocateError(ValueError):
    """This Allocate cannot be served; the pod (if known) gets ``bind-phase=failed``."""


@dataclass(frozen=True, slots=True)
class ContainerView:
    """A container of the pod: name and its literal env values (``value:`` only)."""

    name: str
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PodView:
    """The parts of a Pod the plugin reads. ``containers`` = init containers, then
    regular containers (the order of the pod device string, HAMi v2.10).
    ``container_states``: container name (init or regular) -> ``"running"``,
    ``"waiting"`` or ``"terminated"``, from ``status.(init)containerStatuses[].state``; a
    container the kubelet has not reported yet is absent. ``scheduler_name``:
    ``spec.schedulerName``; ``resource_names``: every resource named in a container's
    limits or requests. ``deleting``: ``metadata.deletionTimestamp`` is set (the pod is
    going away; a new pod may take its name). ``sidecars``: names of the restartable init
    containers (``restartPolicy: Always``), which run beside the regular ones."""

    namespace: str
    name: str
    uid: str
    node_name: str = ""
    phase: str = "Pending"
    annotations: Mapping[str, str] = field(default_factory=dict)
    containers: tuple[ContainerView, ...] = ()
    n_init: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    resource_version: str = ""
    container_states: Mapping[str, str] = field(default_factory=dict)
    scheduler_name: str = ""
    resource_names: frozenset[str] = frozenset()
    deleting: bool = False
    sidecars: frozenset[str] = frozenset()

    def long_running(self) -> tuple[ContainerView, ...]:
        """The containers that run for the pod's life: its sidecars and its regular
        containers (ordinary init containers excluded)."""
        return tuple(c for i, c in enumerate(self.containers)
                     if i >= self.n_init or c.name in self.sidecars)


# --- IDs ---------------------------------------------------------------------------------

_REPLICA = re.compile(r"^(.*)-(\d+)$")


def physical_uuid(device_id: str, replicas: Mapping[str, str] | None = None) -> str:
    """Physical GPU UUID of a kubelet device ID.

    Known replica IDs map through ``replicas``; otherwise HAMi's rule: strip ``::N``, or a
    trailing ``-N`` when the ID has exactly 6 dashes (a GPU UUID has 5).
    """
    if replicas is not None and device_id in replicas:
        return replicas[device_id]
    if "::" in device_id:
        return device_id.split("::", 1)[0]
    if device_id.count("-") == 6:
        m = _REPLICA.match(device_id)
        if m:
            return m.group(1)
    return device_id


# --- the scheduler's grant ------------------------------------------------------------------


def decode_entries(pod: PodView) -> PodSingleDevice:
    """The pod's ``to-allocate`` containers (init first). Raises :class:`AllocateError`."""
    try:
        return decode_pod_devices(pod.annotations.get(DEVICES_TO_ALLOCATE, ""))
    except (CodecError, ValueError, IndexError, TypeError) as exc:  # IndexError: interim codec
        raise AllocateError(f"{pod.namespace}/{pod.name}: bad {DEVICES_TO_ALLOCATE}: {exc}") from None


def pending_entries(pod: PodView) -> list[int]:
    """Indices of the non-empty entries still to allocate ([] when undecodable)."""
    try:
        return [i for i, c in enumerate(decode_entries(pod)) if c]
    except AllocateError:
        return []
