"""Cluster state as the scheduler sees it: nodes, pods holding GPUs, quotas.

Source: ``shared/specs/hami-scheduler-spec.md`` §4.2 (filter flow), §4.3 (which pods
count), §4.13 (node registration), §5.2 (quota). Kubernetes objects come in as
JSON-shaped mappings; this module decides, the shells (watch loops, the offline
scheduler, the simulator) only feed it objects and write out its decisions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami.api import names
from hami.core.codec import (
    CodecError,
    MigAllocation,
    decode_mig_allocations,
    decode_node_devices,
    decode_pod_devices,
    encode_mig_allocations,
    encode_pod_devices,
)
from hami.core.collapse import total
from hami.core.config import SchedulerConfig
from hami.core.filter import FilterResult, filter_pod
from hami.core.ledger import PodEntry, UsageLedger
from hami.core.model import PodRequest, PodSingleDevice
from hami.core.quota import QuotaLedger
from hami.core.request import RequestError, pod_request

TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class Decision:
    """A filter decision and the pod annotations that record it (spec §2.2, §4.10).

    ``annotations`` holds ``hami.io/vgpu-node``, ``hami.io/vgpu-devices-to-allocate`` and
    ``hami.io/vgpu-devices-allocated`` when a node was chosen (the shell adds
    ``hami.io/vgpu-time``); empty otherwise.
    """

    result: FilterResult
    request: PodRequest
    annotations: dict[str, str] = field(default_factory=dict)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def pod_uid(pod: Mapping[str, Any]) -> str:
    """The pod's UID, or ``namespace/name`` when it has none yet (offline input)."""
    meta = _meta(pod)
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


class ClusterState:
    """Ledger + quota + config, fed with Kubernetes objects.

    Node methods return the reason a node was not (re)registered, pod methods whether
    the pod is now charged. None of them raise on malformed objects: a bad annotation
    excludes that one node or pod and the reason is returned.
    """

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        self.ledger = UsageLedger()
        self.quota = QuotaLedger(self.config.nvidia)
        #: MIG reservations per charged pod uid, as decoded (runtime identity included).
        self.mig: dict[str, tuple[MigAllocation, ...]] = {}

    # ----------------------------------------------------------------- nodes
    def upsert_node(self, node: Mapping[str, Any], *, cpu_milli: int | None = None,
                    memory_mib: int | None = None) -> str:
        """Register a Node from its ``hami.io/node-nvidia-register`` annotation.

        Returns "" when registered, else the reason (the node is then removed, so no pod
        is placed on devices it no longer reports).
        """
        meta = _meta(node)
        name = str(meta.get("name") or "")
        annotations = dict(meta.get("annotations") or {})
        raw = annotations.get(names.NODE_REGISTER)
        if raw is None:
            self.ledger.remove_node(name)
            return f"annos not found {names.NODE_REGISTER}"
        try:
            devices = decode_node_devices(raw)
        except CodecError as exc:
            self.ledger.remove_node(name)
            return f"node {name}: {exc}"
        self.ledger.add_node(name, devices, cpu_milli=cpu_milli, memory_mib=memory_mib,
                             annotations=annotations)
        return ""

    def remove_node(self, name: str) -> None:
        """Forget a deleted node."""
        self.ledger.remove_node(name)

    # ------------------------------------------------------------------ pods
    def upsert_pod(self, pod: Mapping[str, Any]) -> bool:
        """Apply HAMi's membership rules (spec §4.3) to an added or updated Pod.

        Counted: pods with ``hami.io/vgpu-node`` and a decodable
        ``hami.io/vgpu-devices-allocated``, not Succeeded/Failed. A Terminating pod keeps
        its charge but is never newly added. When every init container has finished the
        charge shrinks to the app containers. Returns whether the pod is charged.
        """
        meta = _meta(pod)
        uid = pod_uid(pod)
        annotations = meta.get("annotations") or {}
        node = annotations.get(names.VGPU_NODE)
        phase = (pod.get("status") or {}).get("phase")
        existing = self.ledger.pod(uid)
        if not node or phase in TERMINAL_PHASES:
            self.remove_pod(uid)
            return False
        if existing is not None:
            self._shrink_when_init_done(pod, uid)
            return True
        if meta.get("deletionTimestamp"):
            return False
        try:
            devices = decode_pod_devices(annotations.get(names.DEVICES_ALLOCATED, ""))
        except CodecError:
            return False
        try:
            mig = decode_mig_allocations(annotations.get(names.MIG_ALLOCATIONS, "") or "[]")
        except CodecError:
            mig = ()  # HAMi ignores a bad MIG annotation too (spec §6.4)
        spec = pod.get("spec") or {}
        n_init = len(spec.get("initContainers") or [])
        self.charge(uid, str(node), devices, n_init,
                    namespace=str(meta.get("namespace") or "default"),
                    name=str(meta.get("name") or ""), mig=mig)
        self._shrink_when_init_done(pod, uid)
        return True

    def _shrink_when_init_done(self, pod: Mapping[str, Any], uid: str) -> None:
        """Once every init container has finished, charge the app containers only."""
        if init_containers_done(pod):
            swapped = self.ledger.shrink_pod(uid)
            if swapped:
                self._release_quota(swapped[0])
                self._charge_quota(swapped[1])

    def charge(self, uid: str, node: str, devices: PodSingleDevice, n_init: int, *,
               namespace: str, name: str = "", cpu_milli: int = 0, memory_mib: int = 0,
               mig: tuple[MigAllocation, ...] = ()) -> PodEntry:
        """Charge a grant (and its MIG instances) to the ledger and the namespace quota,
        replacing an earlier charge of the same pod."""
        self.remove_pod(uid)
        entry = self.ledger.add_pod(uid, node, devices, n_init, namespace=namespace,
                                    name=name, cpu_milli=cpu_milli, memory_mib=memory_mib,
                                    mig=tuple((m.gpu_uuid, m.placement) for m in mig))
        if mig:
            self.mig[uid] = tuple(mig)
        self._charge_quota(entry)
        return entry

    def _restore(self, entry: PodEntry) -> None:
        restored = self.ledger.add_pod(entry.uid, entry.node, entry.devices, entry.n_init,
                                       namespace=entry.namespace, name=entry.name,
                                       cpu_milli=entry.cpu_milli, memory_mib=entry.memory_mib,
                                       mig=entry.mig)
        if entry.shrunk:
            self.ledger.shrink_pod(entry.uid)
            restored = self.ledger.pod(entry.uid) or restored
        self._charge_quota(restored)

    def remove_pod(self, uid: str) -> None:
        """Release a pod's charge (delete, terminal phase, or re-filter)."""
        entry = self.ledger.remove_pod(uid)
        self.mig.pop(uid, None)
        if entry is not None:
            self._release_quota(entry)

    def _charge_quota(self, entry: PodEntry) -> None:
        self.quota.charge(entry.namespace, *total(entry.charges))

    def _release_quota(self, entry: PodEntry) -> None:
        self.quota.release(entry.namespace, *total(entry.charges))

    # ---------------------------------------------------------------- quotas
    def upsert_quota(self, quota: Mapping[str, Any]) -> None:
        """Apply a ResourceQuota (its ``spec.hard``)."""
        meta = _meta(quota)
        hard = (quota.get("spec") or {}).get("hard") or {}
        self.quota.set_quota(str(meta.get("namespace") or "default"), str(meta.get("name")),
                             hard)

    def remove_quota(self, quota: Mapping[str, Any]) -> None:
        """Forget a deleted ResourceQuota."""
        meta = _meta(quota)
        self.quota.remove_quota(str(meta.get("namespace") or "default"), str(meta.get("name")))

    # ---------------------------------------------------------------- filter
    def filter(self, pod: Mapping[str, Any], node_names: Sequence[str] | None = None) -> Decision:
        """Decide node and GPUs for a pod (spec §4.2 steps 1-8), without charging it.

        The pod's own earlier charge (a retried filter) is released first, as HAMi does.

        Raises:
            RequestError: the pod's GPU request is malformed.
            FilterError: a pod annotation the filter reads is malformed.
        """
        request = pod_request(pod, self.config.nvidia)
        uid = pod_uid(pod)
        earlier = self.ledger.pod(uid) if request.wants_devices else None
        if earlier is not None:
            self.remove_pod(uid)
        try:
            result = filter_pod(request, self.ledger, node_names, self.config.policy,
                                self.quota)
        except Exception:
            if earlier is not None:  # a refused pod keeps what it held
                self._restore(earlier)
            raise
        annotations: dict[str, str] = {}
        if result.node is not None:
            encoded = encode_pod_devices(result.devices)
            annotations = {names.VGPU_NODE: result.node,
                           names.DEVICES_TO_ALLOCATE: encoded,
                           names.DEVICES_ALLOCATED: encoded}
            if result.mig:
                annotations[names.MIG_ALLOCATIONS] = encode_mig_allocations(result.mig)
        return Decision(result, request, annotations)

    def commit(self, pod: Mapping[str, Any], decision: Decision) -> PodEntry | None:
        """Charge a decision (HAMi adds the pod to its cache right after filter)."""
        if decision.result.node is None:
            return None
        req = decision.request
        return self.charge(pod_uid(pod), decision.result.node, decision.result.devices,
                           req.n_init, namespace=req.namespace, name=req.name,
                           cpu_milli=req.cpu_milli, memory_mib=req.memory_mib,
                           mig=decision.result.mig)


__all__ = ["ClusterState", "Decision", "RequestError", "pod_uid", "init_containers_done"]
