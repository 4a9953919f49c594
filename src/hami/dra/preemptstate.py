"""DRA mode's cards and claims as the input of hami's preemption core. Pure.

:func:`hami.core.preemption.plan_preemption` reads a :class:`~hami.core.state.ClusterState`
(cards per node, the charged pods and their slices) and a preemptor whose device request
:func:`hami.core.request.pod_request` reads from its containers. DRA mode has neither:
its cards are the devices of our ResourceSlices, its usage the allocation results of the
ResourceClaims (``consumedCapacity``: ``memory``, ``cores``, ``shares``), and a translated
pod asks for its GPUs through claims, not container limits. This module builds both:

* :func:`dra_cluster`: one registered node per ``spec.nodeName`` of our slices, one card
  per shareable device (:class:`~hami.core.model.DeviceInfo`: the ``uuid``, ``index``,
  ``type``, ``numa`` attributes; ``memory`` MiB, ``cores`` % and ``shares`` as task slots;
  unhealthy or cordoned when tainted so, as ``hami top`` reads them). MIG instance devices
  are left out (preemption frees shares of cards). Each allocated claim on those cards is
  charged to the pod that owns it (the claim made from the pod's template), one
  container per claim; a claim without an owning pod (a tenant's named claim, possibly
  shared) is charged under ``claim:<namespace>/<name>``, so its usage counts but it is
  never a victim. Given the nodes' CPU and memory (:class:`hami.dra.hosts.HostUsage`),
  those count too (:func:`dra_cluster`).
* :func:`preemptor_pod`: the pending pod with its claims' requests written back as
  HAMi's resources (``nvidia.com/gpu`` = ``count``, ``gpumem`` = the ``memory`` capacity
  request in MiB (none: the whole card), ``gpucores`` = ``cores``), one container per
  request, with the pod's metadata (``nvidia.com/use-gputype`` and the other selector
  annotations the webhook leaves on the pod) and its priority.
* :func:`node_admits`: the part of kube-scheduler's own filters a node must pass before
  hami evicts anything there (``spec.unschedulable``, ``nodeSelector``, required node
  affinity, NoSchedule and NoExecute taints), since in DRA mode hami is not told which nodes passed them.

Objects are what the API server returns (dicts), written by tenants in part:
anything malformed counts as nothing (a card without memory, a claim without results),
never as an error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hami.core.config import SchedulerConfig
from hami.core.model import ContainerDevice, DeviceInfo, PodSingleDevice
from hami.core.nodeaffinity import required_affinity_admits
from hami.core.podobjects import list_or_empty, mapping_or_empty
from hami.core.state import ClusterState
from hami.core.vendor import fast_path_vendor
from hami.dra import usage
from hami.dra.fragledger import owner_uid
from hami.dra.fragscore import Request, claim_requests, pod_claim_keys
from hami.dra.hosts import HostUsage, pod_requests
from hami.dra.slices import CORES, DRIVER, MEMORY, MIB, SHARES

Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Card:
    """Where a card of the core's view lives in DRA's objects: ``node``, ``pool`` and
    ``device`` (the allocation result's names)."""

    node: str
    pool: str
    device: str


@dataclass(slots=True)
class DraCluster:
    """The core's view of DRA mode (:func:`dra_cluster`).

    ``state``: cards registered per node, every allocated claim charged. ``cards``: card
    UUID -> :class:`Card`. ``pods``: uid of each charged pod -> ``(namespace, name)``.
    ``claims``: uid of each charged pod -> keys of its claims.
    """

    state: ClusterState
    cards: dict[str, Card] = field(default_factory=dict)
    pods: dict[str, Key] = field(default_factory=dict)
    claims: dict[str, list[Key]] = field(default_factory=dict)


def _card_info(dev: Mapping[str, Any], node: str) -> DeviceInfo | None:
    view = usage._card(dev)
    caps = mapping_or_empty(dev.get("capacity"))
    memory = usage._q(mapping_or_empty(caps.get(MEMORY)).get("value")) // MIB
    if memory <= 0:
        return None
    cores = usage._q(mapping_or_empty(caps.get(CORES)).get("value"))
    shares = usage._q(mapping_or_empty(caps.get(SHARES)).get("value"))
    uuid = view["uuid"] or f"{node}/{dev.get('name')}"
    return DeviceInfo(uuid=uuid, index=max(int(view["index"]), 0),
                      split_count=max(shares, 1), memory_mib=memory,
                      cores_percent=cores if cores > 0 else 100,
                      type=view["type"] or "NVIDIA", numa=int(view["numa"]),
                      health=bool(view["health"]) and not view["cordoned"])


def _results(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    alloc = mapping_or_empty(mapping_or_empty(claim.get("status")).get("allocation"))
    return [r for r in list_or_empty(mapping_or_empty(alloc.get("devices")).get("results"))
            if isinstance(r, Mapping) and r.get("driver") == DRIVER]


def dra_cluster(config: SchedulerConfig, slices: Iterable[Mapping[str, Any]],
                claims: Mapping[Key, Mapping[str, Any]],
                pods: Mapping[str, Mapping[str, Any]] | None = None,
                hosts: HostUsage | None = None) -> DraCluster:
    """The core's view of our ``slices`` and the allocated ``claims`` (by
    ``(namespace, name)``), as described in the module docstring. ``pods``: known pods by
    uid, for their names (a claim's owner reference names its pod too). ``config``: the
    scheduler's (its registry reads the preemptor's request).

    ``hosts`` (refreshed by the caller): the nodes' allocatable CPU and memory and the
    requests of every bound pod. With it each node is registered with its allocatable,
    each charged pod with its requests, and what the other pods of the node request is
    charged under ``host:<node>`` (no devices), so the core's fit checks CPU and memory
    as kube-scheduler's NodeResourcesFit does and a victim's CPU and memory count as
    freed; without it they are not checked."""
    state = ClusterState(config)
    out = DraCluster(state)
    per_node: dict[str, list[DeviceInfo]] = {}
    by_name: dict[tuple[str, str], DeviceInfo] = {}
    for s in slices:
        spec = mapping_or_empty(mapping_or_empty(s).get("spec"))
        node = spec.get("nodeName")
        if spec.get("driver") != DRIVER or not isinstance(node, str) or not node:
            continue
        pool = str(mapping_or_empty(spec.get("pool")).get("name") or node)
        for dev in list_or_empty(spec.get("devices")):
            if (not isinstance(dev, Mapping) or not isinstance(dev.get("name"), str)
                    or usage.instance_profile(dev) is not None):
                continue
            info = _card_info(dev, node)
            if info is None or info.uuid in out.cards:
                continue
            per_node.setdefault(node, []).append(info)
            by_name[(pool, dev["name"])] = info
            out.cards[info.uuid] = Card(node, pool, dev["name"])
    for node, infos in sorted(per_node.items()):
        cpu, mem = hosts.of(node)[:2] if hosts is not None else (-1, -1)
        state.ledger.add_node(node, sorted(infos, key=lambda d: d.index),
                              cpu_milli=cpu if cpu >= 0 else None,
                              memory_mib=mem if mem >= 0 else None)
    grants: dict[str, list[tuple[ContainerDevice, ...]]] = {}
    where: dict[str, str] = {}
    for key, claim in sorted(claims.items()):
        if not isinstance(claim, Mapping):
            continue
        granted = []
        for r in _results(claim):
            info = by_name.get((str(r.get("pool")), str(r.get("device"))))
            if info is None:
                continue
            used = mapping_or_empty(r.get("consumedCapacity"))
            granted.append(ContainerDevice(info.uuid, info.type,
                                           usage._q(used.get(MEMORY)) // MIB,
                                           usage._q(used.get(CORES)), info.index))
        if not granted:
            continue
        node = out.cards[granted[0].uuid].node
        uid = owner_uid(claim)
        if uid.startswith("claim:"):
            uid = f"claim:{key[0]}/{key[1]}"
        if where.setdefault(uid, node) != node:
            continue  # one pod, two nodes: malformed; its first node's claims count
        grants.setdefault(uid, []).append(tuple(granted))
        out.claims.setdefault(uid, []).append(key)
        owner = _owner_name(claim)
        known = mapping_or_empty(mapping_or_empty((pods or {}).get(uid)).get("metadata"))
        out.pods[uid] = (str(known.get("namespace") or key[0]),
                         str(known.get("name") or owner or key[1]))
    held: dict[str, list[int]] = {}
    for uid, containers in grants.items():
        ns, name = out.pods[uid]
        cpu, mem = (hosts.requests_of(uid) if hosts is not None else None) or (0, 0)
        state.charge(uid, where[uid], tuple(containers), 0, namespace=ns, name=name,
                     cpu_milli=cpu, memory_mib=mem)
        sums = held.setdefault(where[uid], [0, 0])
        sums[0] += cpu
        sums[1] += mem
    if hosts is not None:
        for node in per_node:
            _, _, cpu_used, mem_used = hosts.of(node)
            cpu_gpu, mem_gpu = held.get(node, (0, 0))
            if cpu_used - cpu_gpu > 0 or mem_used - mem_gpu > 0:
                state.charge(f"host:{node}", node, (), 0, namespace="", name="",
                             cpu_milli=max(cpu_used - cpu_gpu, 0),
                             memory_mib=max(mem_used - mem_gpu, 0))
    return out


def _owner_name(claim: Mapping[str, Any]) -> str:
    for ref in list_or_empty(mapping_or_empty(claim.get("metadata")).get("ownerReferences")):
        if isinstance(ref, Mapping) and ref.get("kind") == "Pod" and ref.get("name"):
            return str(ref["name"])
    return ""


def _container(i: int, req: Request, names: tuple[str, str, str, int]) -> dict[str, Any]:
    limits: dict[str, Any] = {names[0]: str(req.count)}
    if req.memory_mib > 0 and names[1]:
        factor = max(names[3], 1)
        limits[names[1]] = str(-(-req.memory_mib // factor))
    if req.cores_percent > 0 and names[2]:
        limits[names[2]] = str(req.cores_percent)
    return {"name": f"gpu-{i}", "resources": {"limits": limits}}


def _names(config: SchedulerConfig) -> tuple[str, str, str, int]:
    fast = fast_path_vendor(config.registry)
    if fast is None:
        return ("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores", 1)
    rn = fast[1].resource_names()
    return (rn.count, rn.memory, rn.cores, rn.memory_factor)


def preemptor_pod(pod: Mapping[str, Any], claims: Mapping[Key, Mapping[str, Any]],
                  config: SchedulerConfig) -> dict[str, Any] | None:
    """``pod`` (pending, JSON) as the core reads a preemptor: its metadata, priority and
    ``preemptionPolicy``, one container per request of its claims (module docstring),
    and one with the pod's CPU and memory requests (:func:`hami.dra.hosts.pod_requests`).
    None when it asks for no card of ours, when one of its claims is not there yet, when
    one is already allocated (it is past device allocation), or when a claim asks for
    anything but hami's cards (another driver's devices, a MIG profile only: hami cannot
    tell what would free those)."""
    keys = pod_claim_keys(pod)
    requests: list[Request] = []
    for key in keys:
        claim = claims.get(key)
        if not isinstance(claim, Mapping):
            return None
        if mapping_or_empty(mapping_or_empty(claim.get("status")).get("allocation")):
            return None
        ours = claim_requests(claim)
        devices = mapping_or_empty(mapping_or_empty(claim.get("spec")).get("devices"))
        if len(ours) != len(list_or_empty(devices.get("requests"))):
            return None  # it asks another driver too: hami cannot judge what frees that
        requests.extend(ours)
    if not requests:
        return None
    spec = mapping_or_empty(pod.get("spec"))
    meta = mapping_or_empty(pod.get("metadata"))
    names = _names(config)
    containers = [_container(i, r, names) for i, r in enumerate(requests)]
    cpu, mem = pod_requests(pod)
    if cpu or mem:
        containers.append({"name": "host", "resources": {"requests": {
            "cpu": f"{cpu}m", "memory": f"{mem}Mi"}}})
    return {"metadata": {k: meta.get(k) for k in ("name", "namespace", "uid", "labels",
                                                  "annotations", "creationTimestamp")},
            "spec": {"priority": spec.get("priority"),
                     "preemptionPolicy": spec.get("preemptionPolicy"),
                     "containers": containers}}


def grant_fits(state: ClusterState, node: str, devices: PodSingleDevice) -> bool:
    """Whether ``devices`` (a preemption plan's grant: per container, the cards with the
    memory MiB and cores % each takes) still fit on ``node`` of ``state`` on top of what
    is charged there: per card, memory, cores and one slot per container device within
    its capacity. False when the node or one of the cards is not there."""
    if state.ledger.node(node) is None:
        return False
    usage = {dev.uuid: (dev, slots, memory, cores)
             for dev, slots, memory, cores in state.ledger.device_usage(node)}
    wanted: dict[str, list[int]] = {}
    for container in devices:
        for cd in container:
            add = wanted.setdefault(cd.uuid, [0, 0, 0])
            add[0] += 1
            add[1] += max(cd.used_memory_mib, 0)
            add[2] += max(cd.used_cores_percent, 0)
    for uuid, (slots, memory, cores) in wanted.items():
        if uuid not in usage:
            return False
        dev, used_slots, used_memory, used_cores = usage[uuid]
        if (used_slots + slots > dev.split_count or used_memory + memory > dev.memory_mib
                or used_cores + cores > dev.cores_percent):
            return False
    return True


def _tolerates(tolerations: list[Any], taint: Mapping[str, Any]) -> bool:
    for t in tolerations:
        if not isinstance(t, Mapping):
            continue
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        if op == "Exists" and (not t.get("key") or t.get("key") == taint.get("key")):
            return True
        if (op == "Equal" and t.get("key") == taint.get("key")
                and (t.get("value") or "") == (taint.get("value") or "")):
            return True
    return False


def node_admits(pod: Mapping[str, Any], node: Mapping[str, Any]) -> str:
    """Why kube-scheduler's filters would reject ``node`` for ``pod`` ("" when none of
    those checked here does): ``spec.unschedulable`` (unless tolerated), the pod's
    ``nodeSelector`` against the node's labels, its required node affinity against the
    node's name and labels (:func:`hami.core.nodeaffinity.required_affinity_admits`),
    and each ``NoSchedule``/``NoExecute`` taint the pod does not tolerate (Kubernetes'
    toleration rules: an empty key with ``Exists`` tolerates everything, an empty
    effect every effect, ``Equal`` wants the same key and value, any other operator
    tolerates nothing). Not checked: inter-pod affinity and anti-affinity, topology
    spread constraints, ports, volumes."""
    spec = mapping_or_empty(pod.get("spec"))
    nspec = mapping_or_empty(node.get("spec"))
    labels = mapping_or_empty(mapping_or_empty(node.get("metadata")).get("labels"))
    tolerations = list_or_empty(spec.get("tolerations"))
    if nspec.get("unschedulable") is True and not _tolerates(
            tolerations, {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}):
        return "node is cordoned"
    selector = spec.get("nodeSelector")
    if isinstance(selector, Mapping) and any(labels.get(k) != v for k, v in selector.items()):
        return "node does not match the pod's nodeSelector"
    name = mapping_or_empty(node.get("metadata")).get("name")
    if not required_affinity_admits(spec, name if isinstance(name, str) else "", labels):
        return "node does not match the pod's required node affinity"
    for taint in list_or_empty(nspec.get("taints")):
        if (isinstance(taint, Mapping) and taint.get("effect") in ("NoSchedule", "NoExecute")
                and not _tolerates(tolerations, taint)):
            return f"taint {taint.get('key')} not tolerated"
    return ""


__all__ = ["Card", "DraCluster", "dra_cluster", "grant_fits", "node_admits", "preemptor_pod"]
