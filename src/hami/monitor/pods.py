"""Which pods and containers the monitor reports on. Pure.

HAMi exports per-container series for every loaded cache file of a pod labelled for the
node, finished pods included, so a Succeeded or Failed pod (or a crashed container whose
process slots were never released) keeps reporting its last memory use until the pod is
deleted. Here series exist only while a container can run: none once its pod is
Succeeded or Failed, none while the kubelet reports the container terminated or waiting.
The cache directory itself is kept until the pod is deleted, as in HAMi.

What a container was granted (:func:`container_grants`) comes from the pod, never from
the cache file the container writes: its GPUs from the allocation annotation
``hami.io/vgpu-devices-allocated`` (written by the scheduler), its priority from the
``CUDA_TASK_PRIORITY`` env of its spec (the webhook sets it from the
``nvidia.com/priority`` limit). HAMi's monitor takes both from the shared region, so a
tenant could claim priority 0 on a GPU it does not even use and block others there.
"""

from __future__ import annotations

import re
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from hami.api import names
from hami.core.codec import CodecError, decode_pod_devices
from hami.deviceplugin.allocate import PodView

#: Pod phases after which no container of the pod runs again.
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


def pod_finished(pod: PodView) -> bool:
    """True when the pod's phase is Succeeded or Failed (Kubernetes pod lifecycle: every
    container has terminated and none will be restarted)."""
    return pod.phase in FINISHED_PHASES


def container_running(pod: PodView, name: str) -> bool:
    """True when container ``name`` of ``pod`` should have per-container series: the pod
    is not finished and the kubelet reports the container ``running``, or has not
    reported it yet (a status lags the process start by up to a kubelet sync)."""
    if pod_finished(pod):
        return False
    return pod.container_states.get(name, "running") == "running"


#: Priority of a container whose spec sets none (libvgpu's region default, HAMi-core 1.2).
DEFAULT_PRIORITY = 1
#: ASCII only, as C's ``atoi``: Python's ``\d`` and ``int`` also take other scripts' digits
#: ("\u0660" is 0 to them), which admission does not read as a 0.
_PRIORITY = re.compile(r"\s*(\d{1,10})\s*", re.ASCII)


@dataclass(frozen=True, slots=True)
class Grant:
    """What one container was granted: ``uuids`` its GPUs in grant order (duplicates
    removed), ``priority`` (0 high, larger = lower, :data:`DEFAULT_PRIORITY` unset)."""

    uuids: tuple[str, ...]
    priority: int


def task_priority(value: str | None) -> int:
    """``CUDA_TASK_PRIORITY`` as the monitor uses it: a decimal integer 0..2^31-1 in ASCII
    digits, ASCII blanks around it;
    unset, malformed or negative values give :data:`DEFAULT_PRIORITY` (HAMi's ``atoi``
    lets a negative priority exempt a container from blocking)."""
    m = _PRIORITY.fullmatch(value or "")
    if m is None or int(m.group(1)) > 2**31 - 1:
        return DEFAULT_PRIORITY
    return int(m.group(1))


def granted_priority(priority: int, namespace: str,
                     high_priority_namespaces: AbstractSet[str] | None) -> int:
    """``priority`` as the feedback loop uses it: 0 only for a pod of a namespace in
    ``high_priority_namespaces`` (the operator's grant, ``--high-priority-namespaces``;
    None: every namespace), else :data:`DEFAULT_PRIORITY`. A second line behind admission,
    which refuses priority 0 outside the grant but can be missed (a webhook that failed
    with ``failurePolicy: Ignore``, a spelling it did not read as 0)."""
    if priority == 0 and high_priority_namespaces is not None \
            and namespace not in high_priority_namespaces:
        return DEFAULT_PRIORITY
    return priority


def container_grants(pod: PodView, high_priority_namespaces: AbstractSet[str] | None = None
                     ) -> dict[str, Grant]:
    """Container name -> :class:`Grant` for every container of ``pod`` (init containers
    included). Entry k of ``hami.io/vgpu-devices-allocated`` belongs to container k
    (init containers first, HAMi v2.10); a missing or undecodable annotation grants no
    GPU (the container then shares no GPU with anyone in the feedback loop and has no
    per-device series). Priority 0 only where granted (:func:`granted_priority`)."""
    try:
        entries = decode_pod_devices(pod.annotations.get(names.DEVICES_ALLOCATED, ""))
    except (CodecError, ValueError, IndexError, TypeError):
        entries = ()
    out = {}
    for k, ctr in enumerate(pod.containers):
        uuids = tuple(dict.fromkeys(d.uuid for d in entries[k] if d.uuid)) if k < len(entries) else ()
        prio = task_priority(ctr.env.get(names.ENV_TASK_PRIORITY))
        out[ctr.name] = Grant(uuids, granted_priority(prio, pod.namespace,
                                                      high_priority_namespaces))
    return out
