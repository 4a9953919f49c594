"""Allocate and GetPreferredAllocation decisions (HAMi-core 1.2). Pure.

The shell (:mod:`hami.deviceplugin.service`) fetches pods, calls these functions, applies
the returned host actions and annotation patches. Nothing here does I/O; randomness (the
cache-file UUID) and filesystem facts (does ``libvgpu.so.<ver>`` exist) come in as
arguments.

Deliberate decisions beyond HAMi v2.10 (docs: field case B15 and the concurrency test):

* **Which pod.** HAMi takes the node-lock owner, else the first pending pod in
  bind-phase allocating/success. Kubelet requests carry no pod identity, so when two pods
  wait for Allocate on the node at once HAMi can hand one pod's limits to the other. The
  device IDs do not tell them apart either: kubelet takes them from our own
  GetPreferredAllocation answer, which had to guess the pod the same way. Here the pod is
  served only when it is the one pod that can be meant: the only pod of the node waiting
  for devices (lock owner or pending pod), or the only one whose next entries have the
  requested device counts. Otherwise Allocate fails without touching any pod (kubelet
  rejects the pod it was admitting; the other one is served on its own Allocate). A pod
  with nothing left to allocate, or not pending on this node, is never chosen.
* **Whose GPUs.** The annotation is authoritative: the container gets the annotated GPUs
  even when the kubelet picked replicas of other GPUs (B15). GetPreferredAllocation is
  always offered and answers one replica per annotated GPU, so kubelet's record agrees.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hami.core.codec import CodecError, decode_pod_devices, encode_pod_devices
from hami.core.model import ContainerDevice, PodSingleDevice
from hami.deviceplugin import mps
from hami.deviceplugin.config import PluginConfig

DEVICES_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
BIND_PHASE = "hami.io/bind-phase"
BIND_TIME = "hami.io/bind-time"
VGPU_NODE = "hami.io/vgpu-node"
NODE_LOCK = "hami.io/mutex.lock"

#: Go ``strconv.ParseBool`` true spellings (``CUDA_DISABLE_CONTROL``).
_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})


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
    limits or requests."""

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


@dataclass(frozen=True, slots=True)
class Mount:
    """One bind mount of the Allocate response."""

    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True, slots=True)
class ContainerPlan:
    """The answer for one kubelet container request, plus the host directories to create
    afresh (``host_dirs``, mode 0777) and the read-only files to write (``host_files``:
    ``(host path, text)``, mode 0444)."""

    envs: dict[str, str]
    mounts: tuple[Mount, ...]
    host_dirs: tuple[str, ...]
    entry_index: int
    container_name: str
    devices: tuple[ContainerDevice, ...]
    host_files: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class AllocationPlan:
    """Everything one Allocate call does: responses, new ``to-allocate`` value, and whether
    the pod is complete (no device left -> ``bind-phase=success`` + release node lock)."""

    containers: tuple[ContainerPlan, ...]
    to_allocate: str
    complete: bool


@dataclass(frozen=True, slots=True)
class NodeSettings:
    """Host facts for building responses (HAMi-core 1.2).

    ``hook_path``: ``$HOOK_PATH`` (chart ``/usr/local``); ``lock_dir``: ignored (HAMi
    mounts this one host directory at ``/tmp/vgpulock`` in every container; here each
    container gets its own, see :func:`container_plan`); ``versioned_lib``: True when
    ``<H>/vgpu/libvgpu.so.<version>`` exists; ``license``: True when ``<H>/vgpu/license``
    exists.
    """

    hook_path: str = "/usr/local"
    lock_dir: str = "/tmp/vgpulock"
    version: str = "0.1.0"
    versioned_lib: bool = False
    license: bool = False


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


# --- pod selection (HAMi-core 1.2) ----------------------------------------------------------------


def lock_owner(value: str | None) -> tuple[str, str] | None:
    """``(namespace, name)`` named by a ``hami.io/mutex.lock`` value; None when absent,
    legacy (time only) or malformed (HAMi v2.10)."""
    if not value or "," not in value:
        return None
    parts = value.split(",")
    if len(parts) != 3 or not parts[1] or not parts[2]:
        return None
    return parts[1], parts[2]


def lock_releasable(value: str | None, namespace: str, name: str) -> bool:
    """True when this pod may remove the node lock: it names the pod, or it is legacy."""
    if not value:
        return False
    if "," not in value:
        return True
    return value.endswith(f",{namespace},{name}")


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


def is_candidate(pod: PodView, node: str) -> bool:
    """HAMi's pending-pod test (HAMi-core 1.2 step 2) plus "something is left to allocate"."""
    a = pod.annotations
    return (pod.phase == "Pending" and BIND_TIME in a
            and a.get(BIND_PHASE) in ("allocating", "success")
            and a.get(VGPU_NODE) == node and bool(pending_entries(pod)))


def _bind_time(pod: PodView) -> int:
    try:
        return int(pod.annotations.get(BIND_TIME, ""))
    except ValueError:
        return 2**62


def match_rank(pod: PodView, requests: Sequence[Sequence[str]],
               replicas: Mapping[str, str] | None = None) -> int:
    """How well the pod's next entries fit the kubelet's container requests.

    2 = every request's IDs are replicas of exactly the annotated GPUs; 1 = device counts
    match; 0 = no fit (or MIG/empty requests, which carry no information).
    """
    try:
        entries = [c for c in decode_entries(pod) if c]
    except AllocateError:
        return 0
    if len(entries) < len(requests) or not requests:
        return 0
    exact = True
    for ids, entry in zip(requests, entries, strict=False):
        if len(ids) != len(entry):
            return 0
        if {physical_uuid(i, replicas) for i in ids} != {d.uuid for d in entry}:
            exact = False
    return 2 if exact else 1


def waits_here(pod: PodView, node: str) -> bool:
    """The lock owner may be the pod kubelet is admitting: it is ``Pending`` on ``node``
    (``spec.nodeName``: kubelet only admits pods bound to it) and has devices left."""
    return pod.phase == "Pending" and pod.node_name == node and bool(pending_entries(pod))


def choose_pod(requests: Sequence[Sequence[str]], owner: PodView | None,
               candidates: Sequence[PodView], node: str,
               replicas: Mapping[str, str] | None = None) -> PodView | None:
    """The pod this Allocate serves (see module docstring), or None when no pod waits.

    ``owner`` is the lock owner (if any), ``candidates`` the pods bound to ``node``. The
    pool is the owner (when :func:`waits_here`) and every :func:`is_candidate`; its only
    pod is served (a count mismatch then fails that pod, as in HAMi), else its only pod
    whose next entries have the requested device counts (:func:`match_rank` > 0).

    Raises:
        AllocateError: several pods could be meant (none of them is to be marked failed:
            the kubelet fails the one it was admitting).
    """
    pool: dict[tuple[str, str], PodView] = {}
    if owner is not None and waits_here(owner, node):
        pool[(owner.namespace, owner.name)] = owner
    for p in candidates:
        if is_candidate(p, node):
            pool.setdefault((p.namespace, p.name), p)
    if len(pool) <= 1:
        return next(iter(pool.values()), None)
    fits = [p for p in pool.values() if match_rank(p, requests, replicas) > 0]
    if len(fits) == 1:
        return fits[0]
    waiting = ", ".join(f"{ns}/{name}" for ns, name in sorted(pool))
    raise AllocateError(
        f"cannot tell which pod this Allocate is for: {waiting} all wait for devices on "
        f"node {node} and {'fit' if fits else 'none fits'} the request "
        f"{[len(ids) for ids in requests]} device(s); refusing rather than serving one "
        f"pod another pod's devices")


# --- response (HAMi-core 1.2) ---------------------------------------------------------------------


def go_parse_bool_true(value: str | None) -> bool:
    """Go ``strconv.ParseBool`` == true."""
    return value in _GO_TRUE


#: Name of the limits file libvgpu reads next to itself (``<H>/vgpu/limits.env`` in the
#: container; native/libvgpu/src/limits.c).
LIMITS_FILE = "limits.env"
#: The env names libvgpu also reads from the limits file.
LIMIT_ENVS = ("CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_MEMORY_SHARED_CACHE")


def container_plan(devices: Sequence[ContainerDevice], pod: PodView, entry_index: int,
                   cfg: PluginConfig, node: NodeSettings, cache_name: str) -> ContainerPlan:
    """Envs, mounts and host dirs for one container (exact strings of HAMi-core 1.2; in
    mode ``mps`` with our MPS plumbing enabled, plus :func:`hami.deviceplugin.mps.client_env`
    and its mounts after HAMi's).

    Beyond HAMi, two mounts come from ``<H>/vgpu/containers/<podUID>_<ctr>.plugin/``, a
    host directory no container sees (so no container can swap a mount source for a
    symlink before a restart): ``limits.env`` (the limit, SM and cache-path variables
    as ``KEY=VALUE`` lines) read-only at ``<H>/vgpu/limits.env``, where libvgpu finds its
    limits even in a process that lost its environment; and the container's own
    ``vgpulock`` directory at ``/tmp/vgpulock`` instead of one host directory writable by
    every GPU container. The monitor removes the directory with the pod's.

    ``cache_name`` is the random UUIDv4 of ``CUDA_DEVICE_MEMORY_SHARED_CACHE``.
    Raises :class:`AllocateError` when the entry has no matching container.
    """
    if not devices:
        raise AllocateError("empty container entry")
    if entry_index >= len(pod.containers):
        raise AllocateError(
            f"{pod.namespace}/{pod.name}: device entry {entry_index} has no container "
            f"(pod has {len(pod.containers)})")
    ctr = pod.containers[entry_index]
    h = node.hook_path.rstrip("/") or ""
    vgpu = f"{h}/vgpu"
    uuids: list[str] = []
    for d in devices:
        if d.uuid not in uuids:
            uuids.append(d.uuid)
    envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(uuids)}
    for i, d in enumerate(devices):
        envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{d.used_memory_mib}m"
    envs["CUDA_DEVICE_SM_LIMIT"] = str(devices[0].used_cores_percent)
    envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{vgpu}/{cache_name}.cache"
    if cfg.oversubscribed:
        envs["CUDA_OVERSUBSCRIBE"] = "true"
    if cfg.libcuda_log_level:
        envs["LIBCUDA_LOG_LEVEL"] = cfg.libcuda_log_level
    if cfg.disable_core_limit:
        envs["GPU_CORE_UTILIZATION_POLICY"] = "disable"
    cache_dir = f"{vgpu}/containers/{pod.uid}_{ctr.name}"
    private = f"{cache_dir}.plugin"  # container names are DNS labels: no '.', no clash
    lock_dir = f"{private}/vgpulock"
    limits = "".join(f"{k}={v}\n" for k, v in envs.items() if k.startswith(LIMIT_ENVS))
    lib = f"{vgpu}/libvgpu.so.{node.version}" if node.versioned_lib else f"{vgpu}/libvgpu.so"
    mounts = [
        Mount(f"{vgpu}/libvgpu.so", lib, True),
        Mount(vgpu, cache_dir, False),
        Mount(f"{vgpu}/{LIMITS_FILE}", f"{private}/{LIMITS_FILE}", True),
        Mount("/tmp/vgpulock", lock_dir, False),
    ]
    if not go_parse_bool_true(ctr.env.get("CUDA_DISABLE_CONTROL")):
        mounts.append(Mount("/etc/ld.so.preload", f"{vgpu}/ld.so.preload", True))
    if node.license:
        mounts.append(Mount("/tmp/license", f"{vgpu}/license", True))
        mounts.append(Mount("/usr/bin/vgpuvalidator", f"{vgpu}/vgpuvalidator", True))
    if mps.active(cfg.operating_mode, cfg.mps):  # ours, opt-in: docs/mps.md
        envs.update(mps.client_env(devices, cfg.mps))
        mounts.extend(Mount(*m) for m in mps.client_mounts(cfg.mps))
    return ContainerPlan(envs, tuple(mounts), (cache_dir, lock_dir), entry_index,
                         ctr.name, tuple(devices), ((f"{private}/{LIMITS_FILE}", limits),))


def plan_allocation(pod: PodView, requests: Sequence[Sequence[str]], cfg: PluginConfig,
                    node: NodeSettings, cache_names: Sequence[str]) -> AllocationPlan:
    """Serve ``requests`` (kubelet device IDs per container) from the pod's annotation.

    For each request pop the first non-empty entry, require ``len(entry) == len(ids)``,
    build the container response; the popped entries become empty in ``to_allocate``
    (alignment kept). ``cache_names[k]`` names request k's cache file.

    Raises :class:`AllocateError` (bad annotation, nothing left, count mismatch, ...).
    """
    entries = list(decode_entries(pod))
    plans = []
    for k, ids in enumerate(requests):
        idx = next((i for i, c in enumerate(entries) if c), None)
        if idx is None:
            raise AllocateError(f"{pod.namespace}/{pod.name}: no devices left to allocate")
        devices = entries[idx]
        if len(devices) != len(ids):
            raise AllocateError(
                f"{pod.namespace}/{pod.name}: kubelet asks for {len(ids)} devices, "
                f"the scheduler granted {len(devices)} to container entry {idx}")
        plans.append(container_plan(devices, pod, idx, cfg, node, cache_names[k]))
        entries[idx] = ()
    try:
        value = encode_pod_devices(tuple(entries))
    except (CodecError, ValueError) as exc:
        raise AllocateError(f"cannot re-encode {DEVICES_TO_ALLOCATE}: {exc}") from None
    return AllocationPlan(tuple(plans), value, complete=not any(entries))


def mig_passthrough(ids: Sequence[str]) -> dict[str, str]:
    """Upstream behaviour for MIG-strategy IDs: only ``NVIDIA_VISIBLE_DEVICES``."""
    return {"NVIDIA_VISIBLE_DEVICES": ",".join(ids)}


# --- GetPreferredAllocation (HAMi-core 1.2) -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreferredRequest:
    """One container of a GetPreferredAllocation call."""

    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


def preferred_ids(req: PreferredRequest, entry: Sequence[ContainerDevice] | None,
                  replicas: Mapping[str, str] | None = None) -> list[str]:
    """Kubelet IDs to prefer: must-include first, then for each annotated GPU (the first
    ``size``) the first available replica of it; when short (no annotation, or GPUs not
    available) fill with available IDs on GPUs not yet used, then any available IDs."""
    chosen = list(req.must_include)[: max(req.size, 0)]
    used = {physical_uuid(i, replicas) for i in chosen}
    for d in list(entry or ())[: req.size]:
        if len(chosen) >= req.size:
            break
        if d.uuid in used:
            continue
        for i in req.available:
            if i not in chosen and physical_uuid(i, replicas) == d.uuid:
                chosen.append(i)
                used.add(d.uuid)
                break
    for distinct in (True, False):
        for i in req.available:
            if len(chosen) >= req.size:
                return chosen
            if i in chosen or (distinct and physical_uuid(i, replicas) in used):
                continue
            chosen.append(i)
            used.add(physical_uuid(i, replicas))
    return chosen


def preferred_allocation(pod: PodView | None, requests: Sequence[PreferredRequest],
                         replicas: Mapping[str, str] | None = None) -> list[list[str]]:
    """Answer for every container request: request k follows the pod's k-th non-empty
    entry (kubelet asks container by container, before each Allocate)."""
    entries: list[tuple[ContainerDevice, ...]] = []
    if pod is not None:
        try:
            entries = [c for c in decode_entries(pod) if c]
        except AllocateError:
            entries = []
    return [preferred_ids(r, entries[k] if k < len(entries) else None, replicas)
            for k, r in enumerate(requests)]


def preferred_rank(pod: PodView, requests: Sequence[PreferredRequest],
                   replicas: Mapping[str, str] | None = None) -> int:
    """2 when the pod's next entries have the requested sizes and all their GPUs have an
    available replica; 1 when only sizes match; 0 otherwise."""
    entries = [c for c in decode_entries(pod) if c] if pending_entries(pod) else []
    if len(entries) < len(requests) or not requests:
        return 0
    rank = 2
    for r, entry in zip(requests, entries, strict=False):
        if len(entry) != r.size:
            return 0
        avail = {physical_uuid(i, replicas) for i in r.available + r.must_include}
        if not {d.uuid for d in entry} <= avail:
            rank = 1
    return rank


def choose_preferred_pod(requests: Sequence[PreferredRequest], owner: PodView | None,
                         candidates: Sequence[PodView], node: str,
                         replicas: Mapping[str, str] | None = None) -> PodView | None:
    """The pod whose GPUs GetPreferredAllocation prefers: like :func:`choose_pod`'s pool,
    best :func:`preferred_rank` first, then the lock owner, then older bind-time. Only a
    preference: Allocate still refuses when several pods could be meant."""
    pool: dict[tuple[str, str], PodView] = {}
    if owner is not None and waits_here(owner, node):
        pool[(owner.namespace, owner.name)] = owner
    for p in candidates:
        if is_candidate(p, node):
            pool.setdefault((p.namespace, p.name), p)
    if not pool:
        return None
    owner_key = (owner.namespace, owner.name) if owner is not None else None
    return min(pool.values(), key=lambda p: (
        -preferred_rank(p, requests, replicas),
        0 if (p.namespace, p.name) == owner_key else 1, _bind_time(p), p.namespace, p.name))
