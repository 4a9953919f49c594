"""Allocate mode ``cdi``: decisions. Pure.

The kubelet's Allocate names device IDs, never a pod. In HAMi's protocol the plugin finds
the pod through the node lock the scheduler holds (:mod:`.allocate`); in this mode it
does not have to:

1. ``Allocate`` answers each container with a CDI device named after the kubelet's device
   IDs (:func:`cdi_device_name`) and ``NVIDIA_VISIBLE_DEVICES=void``
   (:data:`FAIL_CLOSED_ENV`): a runtime that ignores CDI starts the container without a
   GPU. It chooses no pod and writes nothing.
2. ``PreStartContainer`` (again device IDs only) asks the kubelet's pod-resources API which
   container holds exactly those IDs (:func:`holder_of`): the kubelet recorded them at
   Allocate and never gives one device ID to two containers. The container's devices
   and limits come from that pod's signed ``hami.io/vgpu-devices-allocated`` entry at the
   container's index (:func:`container_plan_for`), so serving is independent of the order
   containers start in and of how often one restarts. The CDI spec
   (:func:`spec_for`) carries exactly what HAMi's Allocate answer carries; the runtime
   applies it when it creates the container, after PreStartContainer returned.
3. Nothing else is written on success: the scheduler's Binding already says
   ``bind-phase=success`` with the to-allocate string emptied (on such a node there is no
   node lock to release and nothing left to choose, so the signed allocation is final
   once the Binding lands). The plugin writes ``bind-phase=failed`` when it refuses a
   container of a pod bound here (:func:`failure_patch`), and completes a pod that does
   not say ``success`` (a Binding from before this rule, a pod that also holds another
   vendor's devices, or one marked failed and now served) or lacks its label
   (:func:`completion_patch`).

The scheduler binds pods on a node that advertises the mode without the node lock
(``hami.io/node-allocate-mode``, :mod:`hami.scheduler.bindflow`), and writes their
allocation with the Binding, not in a pod patch of its own before it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami.api import names
from hami.core.codec import CodecError, decode_pod_devices, encode_pod_devices
from hami.core.model import PodSingleDevice
from hami.deviceplugin.allocate import (
    AllocateError,
    ContainerPlan,
    NodeSettings,
    PodView,
    container_plan,
)
from hami.deviceplugin.config import PluginConfig
from hami.dra.cdi import cdi_spec

#: CDI kind of the per-container devices: ``hami.io/vgpu=<digest of the device IDs>``.
CDI_KIND = "hami.io/vgpu"
#: The env of every container answer: no GPU unless the CDI spec (whose env edits replace
#: a variable of the same name) says which.
FAIL_CLOSED_ENV = {names.ENV_VISIBLE_DEVICES: "void"}
#: Spec annotations naming the container a spec was written for.
SPEC_POD_UID = "hami.io/pod-uid"
SPEC_CONTAINER = "hami.io/container"
#: File names of our specs in the CDI directory:
#: ``hami.io-vgpu-<resource, '/' as '_'>-<digest>.json`` (:func:`spec_file_name`).
SPEC_PREFIX = "hami.io-vgpu-"
_DIGEST_HEX = 32


@dataclass(frozen=True, slots=True)
class Holder:
    """A container of the kubelet's pod-resources listing and the device IDs of one
    resource it holds."""

    namespace: str
    pod: str
    container: str
    device_ids: frozenset[str]


def device_digest(resource_name: str, device_ids: Iterable[str]) -> str:
    """First 32 hex digits of SHA-256 over the resource name and the sorted device IDs
    (one per line): the same IDs always name the same device, whatever their order."""
    text = "\n".join([resource_name, *sorted(device_ids)])
    return hashlib.sha256(text.encode()).hexdigest()[:_DIGEST_HEX]


def cdi_device_name(resource_name: str, device_ids: Iterable[str]) -> str:
    """The fully qualified CDI device name, ``hami.io/vgpu=<digest>``."""
    return f"{CDI_KIND}={device_digest(resource_name, device_ids)}"


def spec_prefix(resource_name: str) -> str:
    """The start of the file names of one resource's specs (a plugin sweeps only its own)."""
    return f"{SPEC_PREFIX}{resource_name.replace('/', '_')}-"


def spec_file_name(resource_name: str, device_ids: Iterable[str]) -> str:
    """File name of that device's spec in the CDI directory."""
    return f"{spec_prefix(resource_name)}{device_digest(resource_name, device_ids)}.json"


def holder_of(listing: Sequence[Holder], device_ids: Iterable[str]) -> Holder:
    """The one container of ``listing`` (already restricted to the plugin's resource)
    that holds exactly ``device_ids``.

    Raises:
        AllocateError: no container holds them (not allocated by this kubelet, or the pod
            is gone), or several do (never from a sound kubelet: refused, not guessed).
    """
    wanted = frozenset(device_ids)
    if not wanted:
        raise AllocateError("PreStartContainer names no device")
    hits = [h for h in listing if h.device_ids == wanted]
    if not hits:
        raise AllocateError(f"no container holds devices {sorted(wanted)} in the kubelet's "
                            "pod resources")
    if len(hits) > 1:
        who = ", ".join(f"{h.namespace}/{h.pod}/{h.container}" for h in hits)
        raise AllocateError(f"devices {sorted(wanted)} are listed for several containers "
                            f"({who}); refusing rather than guessing")
    return hits[0]


def granted(pod: PodView) -> PodSingleDevice:
    """The pod's signed grant, one entry per container (init first), from
    ``hami.io/vgpu-devices-allocated``. Raises :class:`AllocateError` when it is missing
    or malformed."""
    raw = pod.annotations.get(names.DEVICES_ALLOCATED)
    if not raw:
        raise AllocateError(f"{pod.namespace}/{pod.name}: no {names.DEVICES_ALLOCATED}")
    try:
        return decode_pod_devices(raw)
    except (CodecError, ValueError, IndexError, TypeError) as exc:
        raise AllocateError(f"{pod.namespace}/{pod.name}: bad {names.DEVICES_ALLOCATED}: "
                            f"{exc}") from None


def container_index(pod: PodView, container: str) -> int:
    """Index of ``container`` in the pod (init containers first, the order of the device
    string). Raises :class:`AllocateError` when the pod has no such container."""
    for i, c in enumerate(pod.containers):
        if c.name == container:
            return i
    raise AllocateError(f"{pod.namespace}/{pod.name} has no container {container!r}")


def gpu_containers(pod: PodView) -> tuple[str, ...]:
    """Names of the containers the grant gives devices to. Raises :class:`AllocateError`."""
    entries = granted(pod)
    return tuple(c.name for i, c in enumerate(pod.containers) if i < len(entries) and entries[i])


def check_pod_here(pod: PodView, node: str) -> None:
    """The pod is bound to ``node`` and its allocation is for ``node`` (the guard's
    signature check comes on top when configured). Raises :class:`AllocateError`."""
    who = f"{pod.namespace}/{pod.name}"
    if pod.node_name != node:
        raise AllocateError(f"{who} is bound to {pod.node_name or 'no node'!r}, not {node!r}")
    if pod.annotations.get(names.VGPU_NODE) != node:
        raise AllocateError(f"{who}: its allocation is not for node {node!r}")
    if pod.phase not in ("Pending", "Running"):
        raise AllocateError(f"{who} is {pod.phase}: no container of it starts")


def container_plan_for(pod: PodView, container: str, device_ids: Sequence[str],
                       cfg: PluginConfig, settings: NodeSettings,
                       cache_name: str) -> ContainerPlan:
    """The container's plan (:func:`hami.deviceplugin.allocate.container_plan`: HAMi's
    envs, mounts, host dirs and limits file) from its entry of the signed grant.

    As in HAMi's mode the grant is authoritative for which GPUs (the kubelet's IDs may be
    replicas of others, B15); their number must match. Raises :class:`AllocateError`:
    no such container, no grant for it, or another device count.
    """
    index = container_index(pod, container)
    entries = granted(pod)
    entry = entries[index] if index < len(entries) else ()
    who = f"{pod.namespace}/{pod.name} container {container!r}"
    if not entry:
        raise AllocateError(f"{who} holds {len(device_ids)} device(s) but its allocation "
                            "grants it none")
    if len(entry) != len(device_ids):
        raise AllocateError(f"{who}: the kubelet gave {len(device_ids)} device(s), the "
                            f"scheduler granted {len(entry)}")
    return container_plan(entry, pod, index, cfg, settings, cache_name)


def spec_for(device_name: str, plan: ContainerPlan, pod: PodView) -> dict[str, Any]:
    """The CDI spec (a JSON document) of one container device: the plan's envs and
    mounts (:func:`hami.dra.cdi.cdi_spec`), annotated with the pod UID and container it
    was written for (:func:`spec_owner`)."""
    kind, _, name = device_name.partition("=")
    return cdi_spec(name, plan, kind=kind, annotations={
        SPEC_POD_UID: pod.uid, SPEC_CONTAINER: plan.container_name})


def spec_owner(spec: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(pod UID, container)`` a spec of ours was written for; None when the document
    does not say (not ours, or damaged: it is then written afresh)."""
    ann = spec.get("annotations") if isinstance(spec, Mapping) else None
    if not isinstance(ann, Mapping):
        return None
    uid, ctr = ann.get(SPEC_POD_UID), ann.get(SPEC_CONTAINER)
    if isinstance(uid, str) and isinstance(ctr, str) and uid and ctr:
        return uid, ctr
    return None


def all_served(pod: PodView, served: Iterable[str]) -> bool:
    """Every container the grant gives devices to is in ``served`` (names of the pod's
    containers whose spec is written). Raises :class:`AllocateError` (bad grant)."""
    done = set(served)
    return all(c in done for c in gpu_containers(pod))


def completion_patch(pod: PodView) -> dict[str, str] | None:
    """The one patch (annotations) once every GPU container of the pod is served; None
    when there is nothing to write (the usual case: the Binding said ``success``).

    A pod that says ``bind-phase=success`` gets at most the ``hami.io/vgpu-node`` label:
    an API server copies a Binding's labels only in newer releases (measured: v1.35.4
    copies them, v1.33.13 does not), and the monitor selects pods by it, so
    when the pod lacks it the patch carries ``hami.io/vgpu-node`` with its value
    unchanged, which the shell mirrors into the label
    (:meth:`hami.deviceplugin.kube.KubeApi.patch_pod_annotations`). Any other pod gets
    what HAMi's plugin leaves: ``bind-phase=success``, the to-allocate string with every
    entry emptied, and the label when missing. Raises :class:`AllocateError` (bad grant).
    """
    node = pod.annotations.get(names.VGPU_NODE)
    label: dict[str, str] = ({names.VGPU_NODE: node}
                             if node and pod.labels.get(names.VGPU_NODE) != node else {})
    if pod.annotations.get(names.BIND_PHASE) == "success":
        return label or None
    try:
        empty = encode_pod_devices(tuple(() for _ in granted(pod)))
    except (CodecError, ValueError) as exc:
        raise AllocateError(f"cannot encode {names.DEVICES_TO_ALLOCATE}: {exc}") from None
    return {names.BIND_PHASE: "success", names.DEVICES_TO_ALLOCATE: empty, **label}


def failure_patch(pod: PodView) -> dict[str, str] | None:
    """The patch that marks a refused pod (bound to this node) ``bind-phase=failed``, as
    HAMi's plugin does when Allocate fails; None when it already says so (a container
    the kubelet retries is not written again)."""
    if pod.annotations.get(names.BIND_PHASE) == "failed":
        return None
    return {names.BIND_PHASE: "failed"}


def stale_specs(resource_name: str, spec_files: Iterable[str], live: Iterable[str]
                ) -> list[str]:
    """File names of the resource's specs (:func:`spec_prefix`) whose device no container
    holds any more (``live``: the spec file names of the devices the kubelet still lists
    for the resource)."""
    keep = set(live)
    prefix = spec_prefix(resource_name)
    return sorted(f for f in spec_files
                  if f.startswith(prefix) and f.endswith(".json") and f not in keep)
