"""Allocate's plan for one pod (HAMi-core 1.2). Pure.

The shell (:mod:`hami.deviceplugin.servicer`) fetches pods, chooses the one an Allocate
serves (:mod:`hami.deviceplugin.podchoice`), calls these functions, applies the returned
host actions and annotation patches. Nothing here does I/O; randomness (the cache-file
UUID) and filesystem facts (does ``libvgpu.so.<ver>`` exist) come in as arguments.

Deliberate decision beyond HAMi v2.10 (docs: field case B15):

* **Whose GPUs.** The annotation is authoritative: the container gets the annotated GPUs
  even when the kubelet picked replicas of other GPUs (B15). GetPreferredAllocation is
  always offered and answers one replica per annotated GPU, so kubelet's record agrees
  (:mod:`hami.deviceplugin.preferred`).

The pod vocabulary (:mod:`hami.deviceplugin.podview`), the pod choice
(:mod:`hami.deviceplugin.podchoice`) and GetPreferredAllocation
(:mod:`hami.deviceplugin.preferred`) are re-exported here under their old names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hami.core.codec import CodecError, encode_pod_devices
from hami.core.model import ContainerDevice
from hami.deviceplugin import mps
from hami.deviceplugin.config import PluginConfig
from hami.deviceplugin.podchoice import (
    choose_pod,
    choose_preferred_pod,
    is_candidate,
    lock_owner,
    lock_releasable,
    match_rank,
    waits_here,
)
from hami.deviceplugin.podview import (
    BIND_PHASE,
    BIND_TIME,
    DEVICES_TO_ALLOCATE,
    NODE_LOCK,
    VGPU_NODE,
    AllocateError,
    ContainerView,
    PodView,
    decode_entries,
    pending_entries,
    physical_uuid,
)
from hami.deviceplugin.preferred import (
    PreferredRequest,
    preferred_allocation,
    preferred_ids,
    preferred_rank,
)

__all__ = [
    "BIND_PHASE", "BIND_TIME", "DEVICES_TO_ALLOCATE", "FEEDBACK_FILE", "LIMITS_FILE", "LIMIT_ENVS", "NODE_LOCK",
    "VGPU_NODE", "AllocateError", "AllocationPlan", "ContainerPlan", "ContainerView", "Mount",
    "NodeSettings", "PodView", "PreferredRequest", "choose_pod", "choose_preferred_pod",
    "container_plan", "decode_entries", "go_parse_bool_true", "is_candidate", "lock_owner",
    "lock_releasable", "match_rank", "mig_passthrough", "pending_entries", "physical_uuid",
    "plan_allocation", "preferred_allocation", "preferred_ids", "preferred_rank", "waits_here",
]

#: Go ``strconv.ParseBool`` true spellings (``CUDA_DISABLE_CONTROL``).
_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})


@dataclass(frozen=True, slots=True)
class Mount:
    """One bind mount of the Allocate response."""

    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True, slots=True)
class ContainerPlan:
    """The answer for one kubelet container request, plus the host directories to create
    afresh (``host_dirs``, mode 0777), the read-only files to write (``host_files``:
    ``(host path, text)``, mode 0444) and the monitor's feedback files to create with
    their initial values (``feedback_files``: host paths,
    :func:`hami.deviceplugin.feedbackfile.create`)."""

    envs: dict[str, str]
    mounts: tuple[Mount, ...]
    host_dirs: tuple[str, ...]
    entry_index: int
    container_name: str
    devices: tuple[ContainerDevice, ...]
    host_files: tuple[tuple[str, str], ...] = ()
    feedback_files: tuple[str, ...] = ()


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


# --- response (HAMi-core 1.2) ---------------------------------------------------------------------


def go_parse_bool_true(value: str | None) -> bool:
    """Go ``strconv.ParseBool`` == true."""
    return value in _GO_TRUE


#: Name of the limits file libvgpu reads next to itself (``<H>/vgpu/limits.env`` in the
#: container; native/libvgpu/src/limits.c).
LIMITS_FILE = "limits.env"
#: Name of the monitor's feedback file, mounted read-only next to libvgpu
#: (``<H>/vgpu/feedback``; :mod:`hami.deviceplugin.feedbackfile`).
FEEDBACK_FILE = "feedback"
#: The env names libvgpu also reads from the limits file (a process's own env may only
#: tighten what the file says: GPU_CORE_UTILIZATION_POLICY=disable there is the only way
#: to switch the SM limiter off).
LIMIT_ENVS = ("CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_MEMORY_SHARED_CACHE",
              "GPU_CORE_UTILIZATION_POLICY")
#: The core policy's env name (the plugin's ``disable_core_limit``, the webhook's gpuCorePolicy).
CORE_POLICY_ENV = "GPU_CORE_UTILIZATION_POLICY"


def container_plan(devices: Sequence[ContainerDevice], pod: PodView, entry_index: int,
                   cfg: PluginConfig, node: NodeSettings, cache_name: str) -> ContainerPlan:
    """Envs, mounts and host dirs for one container (exact strings of HAMi-core 1.2; in
    mode ``mps`` with our MPS plumbing enabled, plus :func:`hami.deviceplugin.mps.client_env`
    and its mounts after HAMi's).

    Beyond HAMi, two mounts come from ``<H>/vgpu/containers/<podUID>_<ctr>.plugin/``, a
    host directory no container sees (so no container can swap a mount source for a
    symlink before a restart): ``limits.env`` (the limit, SM, cache-path and core-policy
    variables as ``KEY=VALUE`` lines) read-only at ``<H>/vgpu/limits.env``, where libvgpu finds its
    limits even in a process that lost its environment; ``feedback`` (the monitor's
    ``utilization_switch`` and priority block, :mod:`hami.deviceplugin.feedbackfile`,
    created by the shell with safe initial values) read-only at ``<H>/vgpu/feedback``,
    where libvgpu takes them from instead of the container-writable region; and the container's own
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
    envs = _hami_envs(devices, cfg, vgpu, cache_name)
    cache_dir = f"{vgpu}/containers/{pod.uid}_{ctr.name}"
    private = f"{cache_dir}.plugin"  # container names are DNS labels: no '.', no clash
    lock_dir = f"{private}/vgpulock"
    file_envs = {k: v for k, v in envs.items() if k.startswith(LIMIT_ENVS)}
    if ctr.env.get(CORE_POLICY_ENV):
        # the webhook's gpuCorePolicy, a literal value the isolation rules checked; it
        # comes after the plugin's env in the container, so it is what the process sees
        file_envs[CORE_POLICY_ENV] = ctr.env[CORE_POLICY_ENV]
    limits = "".join(f"{k}={v}\n" for k, v in file_envs.items())
    mounts = _hami_mounts(vgpu, node, ctr, cache_dir, private)
    if mps.active(cfg.operating_mode, cfg.mps):  # ours, opt-in: docs/mps.md
        envs.update(mps.client_env(devices, cfg.mps))
        mounts.extend(Mount(*m) for m in mps.client_mounts(cfg.mps))
    return ContainerPlan(envs, tuple(mounts), (cache_dir, lock_dir), entry_index,
                         ctr.name, tuple(devices), ((f"{private}/{LIMITS_FILE}", limits),),
                         (f"{private}/{FEEDBACK_FILE}",))


def _hami_envs(devices: Sequence[ContainerDevice], cfg: PluginConfig, vgpu: str,
               cache_name: str) -> dict[str, str]:
    """HAMi-core 1.2's container env, in its order: the visible GPUs (each UUID once),
    a memory limit per device (MiB), the SM share of the first device, the cache file
    under ``vgpu``, then the config's switches."""
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
    return envs


def _hami_mounts(vgpu: str, node: NodeSettings, ctr: ContainerView, cache_dir: str,
                 private: str) -> list[Mount]:
    """The library, the cache dir, the limits and feedback files and the lock dir (from
    the private ``.plugin`` dir), ``/etc/ld.so.preload`` unless the container sets
    ``CUDA_DISABLE_CONTROL`` true, and the license files when the node has them."""
    lib = f"{vgpu}/libvgpu.so.{node.version}" if node.versioned_lib else f"{vgpu}/libvgpu.so"
    mounts = [
        Mount(f"{vgpu}/libvgpu.so", lib, True),
        Mount(vgpu, cache_dir, False),
        Mount(f"{vgpu}/{LIMITS_FILE}", f"{private}/{LIMITS_FILE}", True),
        Mount(f"{vgpu}/{FEEDBACK_FILE}", f"{private}/{FEEDBACK_FILE}", True),
        Mount("/tmp/vgpulock", f"{private}/vgpulock", False),
    ]
    if not go_parse_bool_true(ctr.env.get("CUDA_DISABLE_CONTROL")):
        mounts.append(Mount("/etc/ld.so.preload", f"{vgpu}/ld.so.preload", True))
    if node.license:
        mounts.append(Mount("/tmp/license", f"{vgpu}/license", True))
        mounts.append(Mount("/usr/bin/vgpuvalidator", f"{vgpu}/vgpuvalidator", True))
    return mounts


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
