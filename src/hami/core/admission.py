"""The mutating webhook's decision as a pure function: Pod in, JSON patch or denial out.

Source (HAMi v2.10): (``MutateAdmission`` per vendor). Steps
and messages follow HAMi; where HAMi lets a malformed value through (it accepts a
``gpumem-percentage`` of 101 or 2^32+50 and leaves the pod Pending with a misleading
reason, field case B09) we deny at admission with a message naming the container, the
resource and the valid range. Likewise a ``hami.io/gpu-scheduler-policy`` or
``hami.io/node-scheduler-policy`` annotation with an unknown value, which HAMi silently
replaces by its own fallback policy, is denied with a message listing the valid values.

Vendors: every container goes through the registered NVIDIA backend's ``MutateAdmission``
(``hami.devices.nvidia``) and then through every other registered vendor's (CommonWord
order); a vendor's ``AdmissionError`` is a denial with its message, and the quota
pre-check runs per vendor (:meth:`hami.core.vendor_quota.VendorQuota.admission_denial`).

Isolation (ours, :mod:`hami.core.isolation`, the same checks ``/filter`` repeats): a pod
that asks for devices is refused for host PID/IPC, privileged containers, capabilities
that undo the plugin's mounts, and reserved env, envFrom or mounts in GPU containers; a
container without a GPU ends with ``NVIDIA_VISIBLE_DEVICES=none`` even when the pod set
another value. A pod of another scheduler that asks for devices is refused unless its
schedulerName is listed in ``SchedulerConfig.other_gpu_schedulers`` (HAMi admits it
unchecked); otherwise such a pod only gets the ``NVIDIA_VISIBLE_DEVICES`` rule.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonpatch

from hami.api import names
from hami.core import isolation
from hami.core.collapse import effective_request, role_of
from hami.core.config import SchedulerConfig, unknown_policies
from hami.core.provenance import strip_allocation
from hami.core.quantity import QuantityError
from hami.core.quota import QuotaLedger
from hami.core.request import RequestError, pod_request
from hami.core.vendor import AdmissionError, Vendor, fast_path_vendor
from hami.core.vendor_quota import VendorQuota
from hami.core.vendors import pod_requests


@dataclass(frozen=True, slots=True)
class AdmissionResult:
    """The webhook's answer.

    ``allowed`` False carries ``code`` 403 (denied) or 400 (malformed) and a ``message``;
    ``patch`` is an RFC 6902 JSON Patch (list of operations) from the original pod to
    ``pod``, empty when nothing changed.
    """

    allowed: bool
    message: str = ""
    code: int = 200
    patch: list[dict[str, Any]] = field(default_factory=list)
    pod: dict[str, Any] = field(default_factory=dict)


def _deny(message: str, pod: Mapping[str, Any], code: int = 403) -> AdmissionResult:
    return AdmissionResult(allowed=False, message=message, code=code, pod=dict(pod))


def _skip(pod: Mapping[str, Any], config: SchedulerConfig) -> bool:
    current = (pod.get("spec") or {}).get("schedulerName") or ""
    return bool(current) and (
        current != names.DEFAULT_SCHEDULER or not config.force_overwrite_default_scheduler
    ) and (not config.scheduler_name or current != config.scheduler_name)


def _copy_for_mutation(pod: Mapping[str, Any], metadata: bool = False) -> dict[str, Any]:
    """A copy in which everything the webhook may change is private (spec and its
    containers, and with ``metadata`` the pod's metadata, which some vendors annotate);
    otherwise metadata and status are shared with the original, never written."""
    spec = dict(pod["spec"])
    for key in ("containers", "initContainers"):
        if isinstance(spec.get(key), list):
            spec[key] = copy.deepcopy(spec[key])
    out = {**pod, "spec": spec}
    if metadata and isinstance(pod.get("metadata"), Mapping):
        out["metadata"] = copy.deepcopy(dict(pod["metadata"]))
    return out


def admit(pod: Mapping[str, Any], config: SchedulerConfig,
          quota: QuotaLedger | None = None, *, with_patch: bool = True,
          vendor_quota: VendorQuota | None = None) -> AdmissionResult:
    """Decide one Pod CREATE: :func:`decide` on the pod without the allocation
    annotations and labels a pod creator may not write (removed for every pod, whatever
    its scheduler, :func:`hami.core.provenance.strip_allocation`); the removal is the
    first part of the patch and the result's message names what was removed."""
    if not isinstance(pod, Mapping):
        return _deny("pod is not an object", {}, code=400)
    clean, removed = strip_allocation(pod, config)
    result = decide(clean, config, quota, with_patch=with_patch, vendor_quota=vendor_quota)
    if not removed or not result.allowed:
        return result
    note = f"removed {', '.join(removed)} (only hami's scheduler writes them)"
    patch = result.patch
    if with_patch:
        before, after = dict(pod.get("metadata") or {}), dict(clean["metadata"])
        patch = _prefixed(jsonpatch.make_patch(before, after).patch, "/metadata") + patch
    message = f"{result.message}; {note}" if result.message else note
    return AdmissionResult(allowed=True, message=message, patch=patch, pod=result.pod)


def decide(pod: Mapping[str, Any], config: SchedulerConfig,
           quota: QuotaLedger | None = None, *, with_patch: bool = True,
           vendor_quota: VendorQuota | None = None) -> AdmissionResult:
    """Decide one Pod CREATE (HAMi v2.10 decision sequence, every registered vendor).

    Returns an :class:`AdmissionResult`; never raises on malformed pods: a bad device
    value (any vendor) is a 403 denial with a message, a pod that is not an object is a
    400. A pod that asks for devices with an unknown scheduler-policy annotation is denied
    (403, the message lists the valid values). ``vendor_quota`` is the other vendors'
    namespace quota (HAMi's admission pre-check).
    With ``with_patch=False`` (the simulator, which writes nothing back) the JSON Patch
    is not computed; every decision is the same.
    """
    if not isinstance(pod, Mapping) or not isinstance(pod.get("spec") or {}, Mapping):
        return _deny("pod is not an object", {}, code=400)
    spec = pod.get("spec") or {}
    if not spec.get("containers"):
        return _deny("pod has no containers", pod)
    if _skip(pod, config):
        return _admit_foreign(pod, config, with_patch)
    fast = config.fast_vendor()
    vendors = config.vendors()
    mutated = _copy_for_mutation(pod, metadata=bool(vendors))
    mspec = mutated["spec"]
    ordered = [*(mspec.get("initContainers") or []), *mspec["containers"]]
    has_resource = False
    try:
        for container in ordered:
            if not isinstance(container, dict):
                return _deny("container is not an object", pod, code=400)
            if fast is not None:
                has_resource = fast.mutate_admission(container, mutated) or has_resource
            for vendor in vendors.values():
                has_resource = vendor.mutate_admission(container, mutated) or has_resource
    except (RequestError, QuantityError, AdmissionError) as exc:
        return _deny(str(exc), pod)
    if has_resource:
        problems = isolation.violations(mutated, config)
        if problems:
            return _deny(isolation.message(problems), pod)
        unknown = unknown_policies(_annotations(pod))
        if unknown:
            return _deny("; ".join(unknown.values()), pod)
        if config.scheduler_name:
            mspec["schedulerName"] = config.scheduler_name
            if mspec.get("nodeName"):
                return _deny("pod has node assigned", pod)
        runtime_class = isolation.settings(config).runtime_class_name
        if runtime_class and mspec.get("runtimeClassName") is None:
            mspec["runtimeClassName"] = runtime_class
        if quota is not None:
            try:
                denial = _quota_denial(mutated, config, quota)
            except (RequestError, QuantityError) as exc:
                denial = str(exc)
            if denial:
                return _deny(denial, pod)
        if vendor_quota is not None and vendors:
            try:
                denial = _vendor_quota_denial(mutated, vendors, vendor_quota)
            except (AdmissionError, QuantityError) as exc:
                denial = str(exc)
            if denial:
                return _deny(denial, pod)
    if not with_patch:
        return AdmissionResult(allowed=True, pod=mutated)
    patch = _prefixed(jsonpatch.make_patch(dict(spec), mspec).patch, "/spec")
    if vendors and mutated.get("metadata") != pod.get("metadata"):
        before = pod.get("metadata") or {}
        patch += _prefixed(jsonpatch.make_patch(dict(before), mutated["metadata"]).patch,
                           "/metadata")
    return AdmissionResult(allowed=True, patch=patch, pod=mutated)


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod's annotations, or none when metadata or annotations are not objects."""
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return annotations if isinstance(annotations, Mapping) else {}


def _admit_foreign(pod: Mapping[str, Any], config: SchedulerConfig,
                   with_patch: bool) -> AdmissionResult:
    """A pod of another scheduler: refused when it asks for devices and its scheduler is
    not allowed; else unchanged but for ``NVIDIA_VISIBLE_DEVICES=none`` (``overwriteEnv``)
    in containers that name no NVIDIA resource."""
    scheduler = str(pod["spec"].get("schedulerName"))
    allowed = scheduler in config.other_gpu_schedulers or scheduler == names.DEFAULT_SCHEDULER
    if not allowed and isolation.asks_for_devices(pod, config):
        return _deny(f"pod asks for GPUs but its schedulerName is {scheduler!r}: GPU pods "
                     f"must be scheduled by {config.scheduler_name!r} (or a scheduler the "
                     "hami scheduler allows with --other-gpu-schedulers)", pod)
    unchanged = AdmissionResult(allowed=True, message="pod already has different scheduler "
                                "assigned", pod=dict(pod))
    iso = isolation.settings(config)
    if not iso.overwrite_env:
        return unchanged
    mutated = _copy_for_mutation(pod)
    mspec = mutated["spec"]
    for container in [*(mspec.get("initContainers") or []), *mspec["containers"]]:
        if isinstance(container, dict) and not isolation.asks_for_nvidia(container, iso):
            isolation.hide_gpus(container)
    patch = (_prefixed(jsonpatch.make_patch(dict(pod["spec"]), mspec).patch, "/spec")
             if with_patch else [])
    return AdmissionResult(allowed=True, message=unchanged.message, patch=patch, pod=mutated)


def _prefixed(ops: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    """JSON Patch operations computed on a sub-document, re-rooted at ``prefix``."""
    for op in ops:
        op["path"] = prefix + op["path"]
        if "from" in op:
            op["from"] = prefix + op["from"]
    return list(ops)


def _vendor_quota_denial(pod: Mapping[str, Any], vendors: Mapping[str, Vendor],
                         quota: VendorQuota) -> str:
    """The HAMi v2.10 pre-check for every other vendor (max of app sum and init max,
    sidecars added as Kubernetes adds them)."""
    namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
    requests = pod_requests(vendors, pod)
    denial = quota.admission_denial(namespace, requests)
    if not denial:
        return ""
    return (f"{denial}: namespace {namespace} asks for more {', '.join(requests.vendors)} "
            "memory or cores than its ResourceQuota limits allow")


def _quota_denial(pod: Mapping[str, Any], config: SchedulerConfig,
                  quota: QuotaLedger) -> str:
    """``fitResourceQuota`` (HAMi v2.10): max(sum of app, max of init) of memory and
    cores, with each sidecar added to the app containers and to every init container
    after it (Kubernetes' rule, KEP-753; :func:`hami.core.collapse.effective_request`)."""
    fast = fast_path_vendor(config.registry)
    request = pod_request(pod, dict([fast]) if fast is not None else {})
    mem, cores = effective_request(
        (role_of(position, request.n_init, request.sidecars),
         c.memory_mib * c.nums, c.cores_percent * c.nums)
        for position, c in enumerate(request.containers) if c is not None)
    if mem == 0 and cores == 0:
        return ""
    if quota.fits(request.namespace, mem, cores):
        return ""
    return (f"exceeding resource quota: namespace {request.namespace} asks for {mem} MiB "
            f"and {cores}% cores of GPU; {quota.describe(request.namespace)}")


def admit_ephemeral(pod: Mapping[str, Any], old_pod: Mapping[str, Any] | None,
                    config: SchedulerConfig, *, with_patch: bool = True) -> AdmissionResult:
    """Decide an UPDATE of ``pods/ephemeralcontainers`` (``kubectl debug``).

    Ephemeral containers cannot request resources, so they never get a GPU; where the
    NVIDIA runtime is the node's default, one whose image sets
    ``NVIDIA_VISIBLE_DEVICES=all`` (every CUDA base image) would still see every GPU of
    the node. With ``overwriteEnv`` each *added* ephemeral container (one not in
    ``old_pod``; existing ones are immutable) gets ``NVIDIA_VISIBLE_DEVICES=none`` as its
    last entry of that name, as GPU-less containers do at CREATE. On a pod that asks for
    devices an added ephemeral container that is privileged or adds a denied capability
    is refused (403, :func:`hami.core.isolation.ephemeral_violations`). Never raises; a
    body that is not a pod is a 400.
    """
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    if not isinstance(spec, Mapping):
        return _deny("pod is not an object", {}, code=400)
    ephemeral = spec.get("ephemeralContainers")
    if not isinstance(ephemeral, list):
        return AdmissionResult(allowed=True, pod=dict(pod))
    old_spec = old_pod.get("spec") if isinstance(old_pod, Mapping) else None
    old_list = old_spec.get("ephemeralContainers") if isinstance(old_spec, Mapping) else None
    existing = {c.get("name") for c in old_list or [] if isinstance(c, Mapping)}
    if isolation.asks_for_devices(pod, config):
        problems = [p for c in ephemeral if isinstance(c, Mapping) and c.get("name") not in existing
                    for p in isolation.ephemeral_violations(c)]
        if problems:
            return _deny(isolation.message(problems), pod)
    if not isolation.settings(config).overwrite_env:
        return AdmissionResult(allowed=True, pod=dict(pod))
    mutated_list = copy.deepcopy(ephemeral)
    for container in mutated_list:
        if isinstance(container, dict) and container.get("name") not in existing:
            isolation.hide_gpus(container)
    mutated = {**pod, "spec": {**spec, "ephemeralContainers": mutated_list}}
    patch = (_prefixed(jsonpatch.make_patch(list(ephemeral), mutated_list).patch,
                       "/spec/ephemeralContainers") if with_patch else [])
    return AdmissionResult(allowed=True, patch=patch, pod=mutated)
