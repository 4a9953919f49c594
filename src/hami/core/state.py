"""Cluster state as the scheduler sees it: nodes, pods holding GPUs, quotas.

Source (HAMi v2.10): (filter flow), (which pods
count), (node registration), (quota), (vendors). Kubernetes objects come
in as JSON-shaped mappings; this module decides, the shells (watch loops, the offline
scheduler, the simulator) only feed it objects and write out its decisions.

Vendors: the registry of :class:`~hami.core.config.SchedulerConfig` (built once from the
device config) adds its non-NVIDIA backends everywhere: a node registers the devices of
every vendor it reports (``GetNodeDevices``), a pod is charged what every vendor's
``…-devices-allocated`` annotation says, the filter writes every vendor's annotations
(``PatchAnnotations``) and quota is kept per vendor resource (:class:`VendorQuota`).
Device UUIDs are unique across vendors, so one usage ledger holds them all.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami.api import names
from hami.core import isolation
from hami.core.codec import (
    CodecError,
    MigAllocation,
)
from hami.core.collapse import total
from hami.core.config import SchedulerConfig
from hami.core.decision import Decision, decision_annotations
from hami.core.filter import filter_pod
from hami.core.ledger import PodEntry, UsageLedger
from hami.core.model import PodSingleDevice
from hami.core.noderegistration import read_node_devices
from hami.core.podobjects import (
    TERMINAL_PHASES,
    init_containers_done,
    meta_of,
    pod_uid,
    sidecar_positions,
)
from hami.core.quota import QuotaLedger
from hami.core.request import RequestError, pod_request
from hami.core.vendor import fast_path_vendor
from hami.core.vendor_quota import VendorQuota
from hami.core.vendors import merge_allocation


@dataclass(frozen=True, slots=True)
class Lifted:
    """A charge taken off by :meth:`ClusterState.lift`, to be put back as it was."""

    entry: PodEntry
    vendor_devices: dict[str, PodSingleDevice] | None
    mig: tuple[MigAllocation, ...] | None


class ClusterState:
    """Ledger + quota + config, fed with Kubernetes objects.

    Node methods return the reason a node was not (re)registered, pod methods whether
    the pod is now charged. None of them raise on malformed objects: a bad annotation
    excludes that one node or pod and the reason is returned.

    ``config`` carries the vendor registry (``hami.devices.registry.make_config``); only
    its vendors, NVIDIA included, are scheduled.
    """

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.ledger = UsageLedger()
        #: The registry's share fast-path backend (NVIDIA's with HAMi's vendors: its
        #: requests are ``PodRequest.containers``, its register and pod annotations), if any.
        fast = fast_path_vendor(self.config.registry)
        self.fast = fast[1] if fast is not None else None
        #: Its registry key ("" without one): the CommonWord of its grants and reasons.
        self.fast_word = fast[0] if fast is not None else ""
        self.quota = QuotaLedger(self.fast.resource_names() if self.fast is not None else None)
        #: The registered vendors other than the fast-path one (CommonWord -> backend).
        self.vendors = self.config.vendors()
        #: Their namespace quota (HAMi v2.10); None when only NVIDIA is registered.
        self.vendor_quota = VendorQuota(self.vendors) if self.vendors else None
        #: MIG reservations per charged pod uid, as decoded (runtime identity included).
        self.mig: dict[str, tuple[MigAllocation, ...]] = {}
        #: Other vendors' grants per charged pod uid (CommonWord -> per container).
        self.vendor_devices: dict[str, dict[str, PodSingleDevice]] = {}
        #: Per node, why a vendor's devices were not registered (CommonWord -> reason).
        self.vendor_reasons: dict[str, dict[str, str]] = {}

    # ----------------------------------------------------------------- nodes
    def upsert_node(self, node: Mapping[str, Any], *, cpu_milli: int | None = None,
                    memory_mib: int | None = None,
                    vendors: Collection[str] | None = None) -> str:
        """Register a Node's devices: NVIDIA's ``hami.io/node-nvidia-register`` annotation
        and every other registered vendor's ``GetNodeDevices`` (register annotation or
        node capacity, HAMi v2.10).

        ``vendors`` limits which CommonWords are read (the shell's per-vendor health
        check, HAMi v2.10); None reads all. A vendor whose annotation is malformed is skipped
        (its reason is kept in :attr:`vendor_reasons`) and the others still register.
        Returns "" when some device was registered, else the reason (the node is then
        removed, so no pod is placed on devices it no longer reports). A UUID reported twice
        (in one annotation, or by two vendors such as Enflame's GCU and vGCU over the same
        capacity) registers once, the first time, so usage is never split over two copies
        of one card; the others are reported in :attr:`vendor_reasons`.
        """
        found = read_node_devices(node, self.vendors, vendors, self.fast)
        name, devices, reasons = found.name, found.devices, found.reasons
        self.vendor_reasons[name] = found.skipped
        if not devices:
            self.ledger.remove_node(name)
            if not self.vendors:
                return reasons.get(self.fast_word, "no devices")
            why = [reasons[w] for w in sorted(reasons)]
            return "; ".join(why) or (f"no devices of {', '.join([*self._fast_words, *self.vendors])}"
                                      " on the node")
        self.ledger.add_node(name, devices, cpu_milli=cpu_milli, memory_mib=memory_mib,
                             annotations=found.annotations)
        return ""

    def remove_node(self, name: str) -> None:
        """Forget a deleted node."""
        self.ledger.remove_node(name)
        self.vendor_reasons.pop(name, None)

    # ------------------------------------------------------------------ pods
    def upsert_pod(self, pod: Mapping[str, Any]) -> bool:
        """Apply HAMi's membership rules (HAMi v2.10) to an added or updated Pod.

        Counted: pods of hami's scheduler (``spec.schedulerName`` equal to the configured
        name; any pod when it is empty) with ``hami.io/vgpu-node`` whose
        ``hami.io/vgpu-devices-allocated`` and every other registered vendor's allocated
        annotation decode, not Succeeded/Failed. A pod of another scheduler never
        reserves devices, whatever its annotations say (HAMi counts it: anyone who may
        create a pod could mark a node's cards as full; docs/decisions.md). A Terminating pod (``deletionTimestamp`` set) still holds its
        devices until it is gone, so it is counted whether it was seen before or is seen
        first now (a cold start); HAMi never newly adds one (docs/decisions.md). When every ordinary init container has finished the charge shrinks to the app containers and the sidecars (restartable init containers, held for the pod's life).
        Returns whether the pod is charged.
        """
        meta = meta_of(pod)
        uid = pod_uid(pod)
        annotations = meta.get("annotations") or {}
        node = annotations.get(names.VGPU_NODE)
        phase = (pod.get("status") or {}).get("phase")
        existing = self.ledger.pod(uid)
        if not node or phase in TERMINAL_PHASES or not self._ours(pod):
            self.remove_pod(uid)
            return False
        if existing is not None:
            self._shrink_when_init_done(pod, uid)
            return True
        try:
            devices = self.fast.decode_allocation(annotations) if self.fast is not None else ()
            vendor_devices = {word: grant for word, vendor in self.vendors.items()
                              if (grant := vendor.decode_allocation(annotations))}
        except (CodecError, ValueError):
            return False
        try:
            mig = self.fast.decode_mig(annotations) if self.fast is not None else ()
        except CodecError:
            mig = ()  # HAMi ignores a bad MIG annotation too (HAMi v2.10)
        spec = pod.get("spec") or {}
        n_init = len(spec.get("initContainers") or [])
        self.charge(uid, str(node), devices, n_init,
                    namespace=str(meta.get("namespace") or "default"),
                    name=str(meta.get("name") or ""), mig=mig,
                    vendor_devices=vendor_devices, sidecars=sidecar_positions(pod))
        self._shrink_when_init_done(pod, uid)
        return True

    def _ours(self, pod: Mapping[str, Any]) -> bool:
        """The pod is scheduled by hami (its schedulerName is the configured one)."""
        wanted = self.config.scheduler_name
        spec = pod.get("spec")
        return not wanted or (isinstance(spec, Mapping) and spec.get("schedulerName") == wanted)

    def _shrink_when_init_done(self, pod: Mapping[str, Any], uid: str) -> None:
        """Once every ordinary init container has finished, charge the app containers and
        the sidecars only."""
        if init_containers_done(pod):
            swapped = self.ledger.shrink_pod(uid)
            if swapped:
                self._release_quota(swapped[0])
                self._charge_quota(swapped[1])

    def charge(self, uid: str, node: str, devices: PodSingleDevice, n_init: int, *,
               namespace: str, name: str = "", cpu_milli: int = 0, memory_mib: int = 0,
               mig: tuple[MigAllocation, ...] = (),
               vendor_devices: Mapping[str, PodSingleDevice] | None = None,
               sidecars: frozenset[int] = frozenset()) -> PodEntry:
        """Charge a grant (and its MIG instances) to the ledger and the namespace quota,
        replacing an earlier charge of the same pod.

        ``devices`` is the fast-path vendor's grant (:attr:`fast`, NVIDIA's with HAMi's
        vendors), ``vendor_devices`` the other vendors' (by CommonWord); the ledger holds
        their merge (one entry per container), :attr:`quota` counts the fast-path devices and :attr:`vendor_quota` each vendor's resources.
        ``sidecars``: positions of the restartable init containers (held for the pod's life).
        """
        self.remove_pod(uid)
        others = {w: g for w, g in (vendor_devices or {}).items() if any(g)}
        if others:
            n = max(len(devices), *(len(g) for g in others.values()))
            devices = merge_allocation({self.fast_word: devices, **others}, n)
            self.vendor_devices[uid] = others
        entry = self.ledger.add_pod(uid, node, devices, n_init, namespace=namespace,
                                    name=name, cpu_milli=cpu_milli, memory_mib=memory_mib,
                                    mig=tuple((m.gpu_uuid, m.placement) for m in mig),
                                    sidecars=sidecars)
        if mig:
            self.mig[uid] = tuple(mig)
        self._charge_quota(entry)
        return entry

    def fast_devices(self, entry: PodEntry) -> PodSingleDevice:
        """The fast-path vendor's part of a charged pod's grant (the ledger keeps all
        vendors')."""
        others = self.vendor_devices.get(entry.uid)
        if not others:
            return entry.devices
        theirs = {d.uuid for grant in others.values() for c in grant for d in c}
        return tuple(tuple(d for d in c if d.uuid not in theirs) for c in entry.devices)

    @property
    def _fast_words(self) -> list[str]:
        return [self.fast_word] if self.fast is not None else []

    def lock_vendors(self, uid: str) -> tuple[str, ...]:
        """CommonWords whose node lock a bind of the pod takes, sorted (HAMi v2.10: a
        vendor locks only when a regular container, not an init container, holds its
        devices; a sidecar runs beside the regular containers and locks as they do)."""
        entry = self.ledger.pod(uid)
        if entry is None:
            return ()

        def held(grant: PodSingleDevice) -> bool:
            return any(c for pos, c in enumerate(grant)
                       if pos >= entry.n_init or pos in entry.sidecars)

        words = {w for w, g in self.vendor_devices.get(uid, {}).items() if held(g)}
        if held(self.fast_devices(entry)):
            words.add(self.fast_word)
        return tuple(sorted(words))

    def _restore(self, entry: PodEntry, vendor_devices: dict[str, PodSingleDevice] | None
                 ) -> None:
        if vendor_devices:
            self.vendor_devices[entry.uid] = vendor_devices
        restored = self.ledger.add_pod(entry.uid, entry.node, entry.devices, entry.n_init,
                                       namespace=entry.namespace, name=entry.name,
                                       cpu_milli=entry.cpu_milli, memory_mib=entry.memory_mib,
                                       mig=entry.mig, sidecars=entry.sidecars)
        if entry.shrunk:
            self.ledger.shrink_pod(entry.uid)
            restored = self.ledger.pod(entry.uid) or restored
        self._charge_quota(restored)

    def lift(self, uid: str) -> Lifted | None:
        """Release a pod's charge and return what :meth:`put_back` needs to restore it
        exactly (ledger entry, other vendors' grants, MIG instances, quota); None when
        the pod holds nothing. For dry runs such as preemption (:mod:`hami.core.preemption`)."""
        entry = self.ledger.pod(uid)
        if entry is None:
            return None
        lifted = Lifted(entry, self.vendor_devices.get(uid), self.mig.get(uid))
        self.remove_pod(uid)
        return lifted

    def put_back(self, lifted: Lifted) -> None:
        """Undo :meth:`lift` (replacing whatever the pod holds now); the ledger holds the
        very entry object again, so identity checks of the shells still hold."""
        self.remove_pod(lifted.entry.uid)
        if lifted.vendor_devices:
            self.vendor_devices[lifted.entry.uid] = lifted.vendor_devices
        self.ledger.put_pod(lifted.entry)
        if lifted.mig:
            self.mig[lifted.entry.uid] = lifted.mig
        self._charge_quota(lifted.entry)

    def remove_pod(self, uid: str) -> None:
        """Release a pod's charge (delete, terminal phase, or re-filter)."""
        entry = self.ledger.remove_pod(uid)
        self.mig.pop(uid, None)
        if entry is not None:
            self._release_quota(entry)
        self.vendor_devices.pop(uid, None)

    def _quota_parts(self, entry: PodEntry) -> tuple[tuple[int, int],
                                                     dict[str, PodSingleDevice]]:
        """NVIDIA ``(memory, cores)`` of the entry's charges, and the other vendors'
        grants as quota sees them (ordinary init containers dropped once the pod has
        shrunk; sidecars kept)."""
        others = self.vendor_devices.get(entry.uid)
        if not others:
            return total(entry.charges), {}
        theirs = {d.uuid for grant in others.values() for c in grant for d in c}
        nvidia = total(c for c in entry.charges if c.uuid not in theirs)
        if entry.shrunk:
            others = {w: tuple(() if pos < entry.n_init and pos not in entry.sidecars else c
                               for pos, c in enumerate(g))
                      for w, g in others.items()}
        return nvidia, others

    def _charge_quota(self, entry: PodEntry) -> None:
        nvidia, others = self._quota_parts(entry)
        self.quota.charge(entry.namespace, *nvidia)
        if others and self.vendor_quota is not None:
            self.vendor_quota.add_usage(entry.namespace, others, entry.n_init, entry.sidecars)

    def _release_quota(self, entry: PodEntry) -> None:
        nvidia, others = self._quota_parts(entry)
        self.quota.release(entry.namespace, *nvidia)
        if others and self.vendor_quota is not None:
            self.vendor_quota.remove_usage(entry.namespace, others, entry.n_init,
                                           entry.sidecars)

    # ---------------------------------------------------------------- quotas
    def upsert_quota(self, quota: Mapping[str, Any]) -> None:
        """Apply a ResourceQuota (its ``spec.hard``)."""
        meta = meta_of(quota)
        hard = (quota.get("spec") or {}).get("hard") or {}
        namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name"))
        self.quota.set_quota(namespace, name, hard)
        if self.vendor_quota is not None:
            self.vendor_quota.set_quota(namespace, name, hard)

    def remove_quota(self, quota: Mapping[str, Any]) -> None:
        """Forget a deleted ResourceQuota."""
        meta = meta_of(quota)
        namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name"))
        self.quota.remove_quota(namespace, name)
        if self.vendor_quota is not None:
            self.vendor_quota.remove_quota(namespace, name)

    # ---------------------------------------------------------------- filter
    def filter(self, pod: Mapping[str, Any], node_names: Sequence[str] | None = None, *,
               now_ns: int = 0) -> Decision:
        """Decide node and devices for a pod (HAMi v2.10 steps 1-8), without charging it.

        The pod's own earlier charge (a retried filter) is released first, as HAMi does.
        ``now_ns`` is the clock (Unix ns) for vendors that write it (Ascend, Mthreads
        ``predicate-time``); the core reads no clock.

        Raises:
            RequestError: the pod's device request is malformed, or the pod breaks a rule
                of :mod:`hami.core.isolation` (the webhook's checks, repeated here).
            FilterError: a pod annotation the filter reads is malformed, or two vendors
                would write one pod annotation differently (a device config error).
        """
        request = pod_request(pod, self.config.registry)
        if request.wants_devices:
            problems = isolation.violations(pod, self.config, request.containers)
            if problems:
                raise RequestError(isolation.message(problems))
        uid = pod_uid(pod)
        earlier = self.ledger.pod(uid) if request.wants_devices else None
        earlier_vendors = self.vendor_devices.get(uid)
        earlier_mig = self.mig.get(uid)
        if earlier is not None:
            self.remove_pod(uid)
        try:
            result = filter_pod(request, self.ledger, node_names, self.config.policy,
                                self.quota, vendors=self.vendors,
                                vendor_quota=self.vendor_quota)
            annotations = decision_annotations(result, request, self.vendors, now_ns,
                                               self.fast)
        except Exception:
            if earlier is not None:  # a refused pod keeps what it held
                self._restore(earlier, earlier_vendors)
                if earlier_mig:
                    self.mig[uid] = earlier_mig
            raise
        return Decision(result, request, annotations)

    def commit(self, pod: Mapping[str, Any], decision: Decision) -> PodEntry | None:
        """Charge a decision (HAMi adds the pod to its cache right after filter)."""
        if decision.result.node is None:
            return None
        req = decision.request
        return self.charge(pod_uid(pod), decision.result.node, decision.result.devices,
                           req.n_init, namespace=req.namespace, name=req.name,
                           cpu_milli=req.cpu_milli, memory_mib=req.memory_mib,
                           mig=decision.result.mig,
                           vendor_devices=decision.result.vendor_devices,
                           sidecars=req.sidecars)


__all__ = ["TERMINAL_PHASES", "ClusterState", "Decision", "Lifted", "RequestError", "init_containers_done",
           "pod_uid"]
