"""From a ResourceClaim's allocation to a CDI spec (DRA mode, NodePrepareResources). Pure.

A claim allocated by kube-scheduler names, per request, a device of our slice
(``gpu-<index>``), the share it holds (``shareID``) and what it consumes
(``consumedCapacity``: ``memory`` bytes, ``cores`` percent, ``shares``). The CDI spec gives
the containers that use the claim exactly what the device plugin's Allocate gives a
container (:func:`hami.deviceplugin.allocate.container_plan`): ``NVIDIA_VISIBLE_DEVICES``,
``CUDA_DEVICE_MEMORY_LIMIT_<i>`` (MiB, one per card in request order),
``CUDA_DEVICE_SM_LIMIT``, the shared-cache path, the per-claim cache directory, the
limits file, ``libvgpu.so`` and ``/etc/ld.so.preload`` read-only. The claim takes the
place of the pod container; its host directories live under ``<H>/vgpu/claims/<claimUID>``
(cache) and ``<claimUID>.plugin`` (limits file, lock dir), not under ``containers/``,
whose entries the monitor removes when no pod of that UID exists.

Next to the limits file the plugin keeps the claim's owner record
(:func:`owner_record`, ``<claimUID>.plugin/owner.json``): which pods and containers use
the claim and which GPUs it holds, from the claim's ``status.reservedFor`` and the pods'
specs. The monitor attributes the claim's shared region with it; no container can write
there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hami.api import names
from hami.core.model import ContainerDevice
from hami.core.quantity import QuantityError, to_int_exact
from hami.core.request import quantity
from hami.deviceplugin.allocate import (
    AllocateError,
    ContainerPlan,
    ContainerView,
    Mount,
    NodeSettings,
    PodView,
    container_plan,
)
from hami.deviceplugin.config import PluginConfig
from hami.dra.slices import CORES, DRIVER, MEMORY, MIB

CDI_VERSION = "0.6.0"
#: CDI kind of the per-claim devices: ``gpu.hami.io/claim=<claim UID>``.
CDI_KIND = f"{DRIVER}/claim"
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class ClaimError(ValueError):
    """The claim cannot be prepared on this node (not allocated, foreign device, bad
    capacity); the message goes back to the kubelet as the claim's error."""


@dataclass(frozen=True, slots=True)
class AllocatedCard:
    """One allocation result of our driver: ``request`` name, ``pool`` (the node),
    ``device`` (``gpu-<index>``), ``share_id`` (None for an exclusive device),
    ``memory_bytes`` and ``cores_percent`` consumed."""

    request: str
    pool: str
    device: str
    share_id: str | None
    memory_bytes: int
    cores_percent: int


def _capacity(consumed: Mapping[str, Any], key: str, where: str) -> int:
    raw = consumed.get(key)
    try:
        value = to_int_exact(quantity(raw))
    except (QuantityError, ValueError, TypeError):
        value = None
    if value is None or value < 0:
        raise ClaimError(f"{where}: consumedCapacity {key}={raw!r} is not a whole number")
    return value


def allocated_cards(claim: Mapping[str, Any], node: str) -> list[AllocatedCard]:
    """Our driver's results in the claim's ``status.allocation`` (allocation order).

    Raises:
        ClaimError: the claim is not allocated, holds none of our devices, holds a device
            of another node's pool, or has no whole ``memory``/``cores`` consumption.
    """
    status = claim.get("status") if isinstance(claim, Mapping) else None
    alloc = status.get("allocation") if isinstance(status, Mapping) else None
    devices = alloc.get("devices") if isinstance(alloc, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    if not isinstance(results, list):
        raise ClaimError("claim is not allocated")
    out = []
    for n, r in enumerate(results):
        if not isinstance(r, Mapping) or r.get("driver") != DRIVER:
            continue
        where = f"allocation result {n} ({r.get('device')})"
        if r.get("pool") != node:
            raise ClaimError(f"{where}: pool {r.get('pool')!r} is not this node {node!r}")
        consumed = r.get("consumedCapacity")
        if not isinstance(consumed, Mapping):
            raise ClaimError(f"{where}: no consumedCapacity (is DRAConsumableCapacity off?)")
        share = r.get("shareID")
        out.append(AllocatedCard(str(r.get("request") or ""), node, str(r.get("device")),
                                 str(share) if share else None,
                                 _capacity(consumed, MEMORY, where),
                                 _capacity(consumed, CORES, where)))
    if not out:
        raise ClaimError(f"claim holds no {DRIVER} device")
    return out


def claim_plan(claim_uid: str, namespace: str, name: str, cards: Sequence[AllocatedCard],
               uuids: Mapping[str, str], cfg: PluginConfig, node: NodeSettings,
               cache_name: str) -> ContainerPlan:
    """Allocate's container plan for the claim's cards. ``uuids``: device name -> GPU UUID
    of this node (:func:`hami.dra.slices.device_name`). Memory is MiB rounded down.

    Raises:
        ClaimError: a card is not one of this node's GPUs, or the claim UID is malformed.
    """
    if not _UID.match(claim_uid):
        raise ClaimError(f"malformed claim UID {claim_uid!r}")
    devices = []
    for c in cards:
        if c.device not in uuids:
            raise ClaimError(f"device {c.device} is not a GPU of this node")
        devices.append(ContainerDevice(uuid=uuids[c.device], type="NVIDIA",
                                       used_memory_mib=c.memory_bytes // MIB,
                                       used_cores_percent=c.cores_percent))
    view = PodView(namespace=namespace, name=name, uid=claim_uid,
                   containers=(ContainerView(name="claim"),))
    try:
        plan = container_plan(devices, view, 0, cfg, node, cache_name)
    except AllocateError as exc:
        raise ClaimError(str(exc)) from None
    old, new = f"/containers/{claim_uid}_claim", f"/claims/{claim_uid}"

    def moved(path: str) -> str:
        return path.replace(old, new, 1)

    return replace(plan,
                   mounts=tuple(Mount(m.container_path, moved(m.host_path), m.read_only)
                                for m in plan.mounts),
                   host_dirs=tuple(moved(d) for d in plan.host_dirs),
                   host_files=tuple((moved(p), t) for p, t in plan.host_files),
                   feedback_files=tuple(moved(p) for p in plan.feedback_files))


def claim_dirs(hook_path: str, claim_uid: str) -> tuple[str, str]:
    """The claim's host directories: cache dir and plugin-private dir."""
    base = f"{hook_path.rstrip('/')}/vgpu/{names.DRA_CLAIMS_DIR}/{claim_uid}"
    return base, f"{base}.plugin"


def cdi_device_id(claim_uid: str) -> str:
    """The fully qualified CDI device name of a claim: ``gpu.hami.io/claim=<uid>``."""
    return f"{CDI_KIND}={claim_uid}"


def cdi_spec(claim_uid: str, plan: ContainerPlan, *, kind: str = CDI_KIND,
             annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The CDI spec (a JSON document) with one device named after the claim whose
    container edits are the plan's envs (``KEY=VALUE``) and bind mounts (read-only ones
    with ``ro``). ``kind`` and spec-level ``annotations`` (CDI 0.6.0) are for the device
    plugin's allocate mode ``cdi``, which names its devices differently."""
    mounts = [{"hostPath": m.host_path, "containerPath": m.container_path,
               "options": ["rbind", "ro" if m.read_only else "rw", "nosuid", "nodev"]}
              for m in plan.mounts]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        **({"annotations": dict(annotations)} if annotations else {}),
        "devices": [{
            "name": claim_uid,
            "containerEdits": {"env": [f"{k}={v}" for k, v in plan.envs.items()],
                               "mounts": mounts},
        }],
    }


def spec_file_name(claim_uid: str) -> str:
    """File name of a claim's CDI spec in the CDI directory (``/var/run/cdi``)."""
    return f"{DRIVER}-{claim_uid}.json"


#: Layout version of :func:`owner_record` (the monitor refuses others).
OWNER_VERSION = 1


def reserved_pods(claim: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(name, uid)`` of the pods in the claim's ``status.reservedFor`` (kube-scheduler
    writes it; entries for other resources are skipped)."""
    status = claim.get("status") if isinstance(claim, Mapping) else None
    out = []
    for r in (status.get("reservedFor") if isinstance(status, Mapping) else None) or []:
        if (isinstance(r, Mapping) and r.get("resource") == "pods" and not r.get("apiGroup")
                and r.get("name") and r.get("uid")):
            out.append((str(r["name"]), str(r["uid"])))
    return out


def claim_containers(pod: Mapping[str, Any], claim_name: str) -> tuple[str, ...]:
    """Names of the pod's containers (init containers first) that use the ResourceClaim
    ``claim_name``: a container's ``resources.claims[].name`` names an entry of
    ``spec.resourceClaims`` that is the claim itself (``resourceClaimName``) or made from
    a template for it (``status.resourceClaimStatuses[].resourceClaimName``)."""
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    status = pod.get("status") if isinstance(pod, Mapping) else None
    if not isinstance(spec, Mapping):
        return ()
    refs = {str(r.get("name")) for r in spec.get("resourceClaims") or []
            if isinstance(r, Mapping) and r.get("resourceClaimName") == claim_name}
    if isinstance(status, Mapping):
        refs |= {str(r.get("name")) for r in status.get("resourceClaimStatuses") or []
                 if isinstance(r, Mapping) and r.get("resourceClaimName") == claim_name}
    out = []
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if not isinstance(c, Mapping):
            continue
        used = (c.get("resources") or {}).get("claims") or []
        if any(isinstance(u, Mapping) and str(u.get("name")) in refs for u in used):
            out.append(str(c.get("name") or ""))
    return tuple(out)


def owner_record(claim: Mapping[str, Any], cards: Sequence[AllocatedCard],
                 uuids: Mapping[str, str], pods: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The claim's owner record (JSON document) for the monitor::

        {"version": 1, "claim": {"namespace", "name", "uid"},
         "uuids": [GPU UUID of each card, allocation order],
         "pods": [{"namespace", "name", "uid", "containers": [names]}]}

    ``pods``: the Pod objects (dicts) named by ``status.reservedFor``; one whose UID
    differs from its reservation is left out. Cards that are not this node's GPUs are
    left out of ``uuids`` (:func:`claim_plan` refuses such a claim anyway)."""
    meta = claim.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    reserved = dict((uid, n) for n, uid in reserved_pods(claim))
    out_pods = []
    for pod in pods:
        pm = pod.get("metadata") or {}
        uid = str(pm.get("uid") or "")
        if reserved.get(uid) != pm.get("name"):
            continue
        out_pods.append({"namespace": namespace, "name": reserved[uid], "uid": uid,
                         "containers": list(claim_containers(pod, name))})
    return {"version": OWNER_VERSION,
            "claim": {"namespace": namespace, "name": name, "uid": str(meta.get("uid") or "")},
            "uuids": [uuids[c.device] for c in cards if c.device in uuids],
            "pods": out_pods}
