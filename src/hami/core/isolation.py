"""What a pod spec may not do to a GPU slice: the checks the webhook and ``/filter`` share.

Pure functions over a JSON-shaped Pod. The webhook (:func:`hami.core.admission.admit`)
runs them on the pod it is about to admit; the filter (:meth:`ClusterState.filter`) runs
them again on every pod that asks for devices, so a pod that never met the webhook (a
namespace it does not select, an outage with ``failurePolicy: Ignore``, a pod created
before hami was installed) is refused with the same message instead of being placed.

Why each rule exists (source: HAMi-core 1.2; HAMi's
webhook refuses privileged containers only):

* **Env of GPU containers.** Kubelet puts the container's own ``env`` after the device
  plugin's variables and the runtime keeps the later value, so a pod could set its own
  ``CUDA_DEVICE_MEMORY_LIMIT_0``, ``CUDA_DEVICE_SM_LIMIT``, ``NVIDIA_VISIBLE_DEVICES`` or
  ``CUDA_DISABLE_CONTROL`` (the plugin then skips the ``/etc/ld.so.preload`` mount).
  Names are case-sensitive, as ``getenv`` is: ``cuda_device_sm_limit`` is no reserved name.
  ``CUDA_TASK_PRIORITY`` and ``GPU_CORE_UTILIZATION_POLICY`` are written by the webhook
  itself; an entry is accepted only with the very value the webhook writes.
* **envFrom of GPU containers.** The keys of a ConfigMap or Secret are not known at
  admission and can change later, so an ``envFrom`` without a prefix, or with a prefix
  that can begin a reserved name (``CUDA_``, ``LD_``, ``NVIDIA_``, ``GPU_``), is refused.
* **volumeMounts of GPU containers** on or inside the paths the plugin mounts
  (``<hook path>/vgpu``, ``/etc/ld.so.preload``, ``/tmp/vgpulock``, the licence files),
  after normalising the path (``//``, ``/./``, ``..``, trailing ``/``). A mount *above*
  one of them (``/tmp``, ``/etc``) is allowed: runtimes mount deeper paths later, so the
  plugin's mount lies on top of it.
* **Every container of a pod that asks for devices**: not privileged (HAMi's rule), and
  no added capability that undoes the plugin's mounts or reaches the host files behind
  them (``SYS_ADMIN``, ``DAC_READ_SEARCH``, ``SYS_MODULE``, ``SYS_RAWIO``, ``ALL``); the
  pod shares neither the host's PID nor its IPC namespace.
* **Containers without a GPU** (with ``overwriteEnv``) end with
  ``NVIDIA_VISIBLE_DEVICES=none``, whatever the pod or its image set before.
"""

from __future__ import annotations

import posixpath
from collections.abc import Collection, Mapping, Sequence
from functools import lru_cache
from typing import Any

from hami.api import names
from hami.core.config import SchedulerConfig
from hami.core.model import ContainerDeviceRequest
from hami.core.vendor import EnvIsolation

#: Env names the device plugin sets in GPU containers or libvgpu reads, and why.
RESERVED_ENV: Mapping[str, str] = {
    "CUDA_DEVICE_MEMORY_LIMIT": "the device plugin sets the memory limit",
    "CUDA_DEVICE_SM_LIMIT": "the device plugin sets the cores limit",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE": "the device plugin sets the accounting file",
    "CUDA_DISABLE_CONTROL": "it turns the GPU limits off",
    "CUDA_OVERSUBSCRIBE": "the device plugin sets it",
    "CUDA_REDIRECT": "it tells HAMi's libvgpu where it is loaded from",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "the device plugin sets the MPS cores limit",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "the device plugin sets the MPS memory limit",
    "CUDA_MPS_PIPE_DIRECTORY": "the device plugin sets the MPS pipe",
    names.ENV_VISIBLE_DEVICES: "the device plugin sets which GPUs the container sees",
    "LD_PRELOAD": "it loads code before the GPU limits library",
}
#: Families of reserved names: the prefix followed by anything (per-GPU limits).
RESERVED_ENV_FAMILIES: tuple[str, ...] = ("CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_SM_LIMIT_")
#: Names the webhook writes itself; an entry must carry the webhook's value.
WEBHOOK_ENV: tuple[str, ...] = (names.ENV_TASK_PRIORITY, names.ENV_CORE_POLICY)
#: Added capabilities refused in every container of a GPU pod (upper case, no ``CAP_``).
DENIED_CAPABILITIES: frozenset[str] = frozenset(
    {"ALL", "SYS_ADMIN", "DAC_READ_SEARCH", "SYS_MODULE", "SYS_RAWIO"})
#: Paths the device plugin mounts into GPU containers besides ``<hook path>/vgpu``.
PLUGIN_PATHS: tuple[str, ...] = ("/etc/ld.so.preload", "/tmp/vgpulock", "/tmp/license",
                                 "/usr/bin/vgpuvalidator")


@lru_cache(maxsize=16)
def plugin_paths(hook_path: str) -> tuple[str, ...]:
    """Container paths the device plugin mounts (``hook_path`` is ``$HOOK_PATH``)."""
    return (normalise_path(f"{hook_path}/vgpu"), *PLUGIN_PATHS)


@lru_cache(maxsize=4096)
def normalise_path(path: str) -> str:
    """A mount path as the runtime resolves it lexically: rooted, ``//``, ``.``, ``..``
    and trailing ``/`` folded (``"//etc/./ld.so.preload/"`` -> ``"/etc/ld.so.preload"``)."""
    return posixpath.normpath("/" + path.lstrip("/"))


def is_reserved_env(name: str) -> bool:
    """True for a name the pod may not set in a GPU container (exact case)."""
    return name in RESERVED_ENV or name.startswith(RESERVED_ENV_FAMILIES)


def prefix_reaches_reserved(prefix: str) -> str:
    """A reserved name that ``prefix`` + some non-empty key would form, or ""."""
    for name in (*RESERVED_ENV, *WEBHOOK_ENV):
        if name.startswith(prefix) and name != prefix:
            return name
    for family in RESERVED_ENV_FAMILIES:
        if prefix.startswith(family):
            return prefix + "0"
        if family.startswith(prefix):
            return family + "0"
    return ""


def hide_gpus(container: dict[str, Any]) -> None:
    """Make ``NVIDIA_VISIBLE_DEVICES=none`` the container's only and last entry of that
    name, in place (HAMi appends it and skips containers that already set the name, so
    ``NVIDIA_VISIBLE_DEVICES=all`` in the pod won)."""
    env = container.get("env")
    kept = [e for e in env if not (isinstance(e, Mapping)
                                   and e.get("name") == names.ENV_VISIBLE_DEVICES)] \
        if isinstance(env, list) else []
    container["env"] = [*kept, {"name": names.ENV_VISIBLE_DEVICES, "value": "none"}]


def settings(config: SchedulerConfig) -> EnvIsolation:
    """The env isolation settings of the registered ``NVIDIA`` backend
    (``Vendor.env_isolation``); none (no resources, no ``overwriteEnv``) without one."""
    fast = config.fast_vendor()
    found = fast.env_isolation if fast is not None else None
    return found if found is not None else EnvIsolation()


def asks_for_devices(pod: Mapping[str, Any], config: SchedulerConfig) -> bool:
    """True when some container names an NVIDIA or registered vendor resource in its
    limits or requests (what counts as a GPU pod before any mutation)."""
    wanted = set(settings(config).resources)
    for vendor in config.vendors().values():
        wanted.update(vendor.resource_names().all())
    return any(_resource_keys(c) & wanted for c in _containers(pod))


def asks_for_nvidia(container: Mapping[str, Any], iso: EnvIsolation) -> bool:
    """True when the container names an NVIDIA resource (count, memory, share, cores:
    ``iso.resources``)."""
    return bool(_resource_keys(container) & set(iso.resources))


def violations(pod: Mapping[str, Any], config: SchedulerConfig,
               requests: Sequence[ContainerDeviceRequest | None] | None = None) -> list[str]:
    """Every rule of the module docstring the pod breaks, one message each ([] = none).

    Call it for a pod that asks for devices. ``requests`` are the NVIDIA requests of the
    containers, init containers first (``PodRequest.containers``); None computes them.
    Never raises: malformed fields are reported as messages.
    """
    problems = _host_problems(pod)
    containers = _containers(pod)
    if requests is None:
        requests = [_nvidia_request(c, config) for c in containers]
    paths = plugin_paths(config.hook_path)
    iso = settings(config)
    for position, container in enumerate(containers):
        cname = str(container.get("name", "?"))
        problems.extend(_security_problems(container, cname))
        gpu = position < len(requests) and requests[position] is not None
        if gpu:
            problems.extend(_env_problems(container, cname, iso))
            problems.extend(_mount_problems(container, cname, paths))
        elif iso.overwrite_env and not _ends_hidden(container):
            problems.append(f"container {cname} asks for no GPU but does not end with "
                            f"{names.ENV_VISIBLE_DEVICES}=none (the webhook did not see "
                            "this pod)")
    return problems


def security_violations(pod: Mapping[str, Any], config: SchedulerConfig | None = None,
                        gpu_containers: Collection[str] = ()) -> list[str]:
    """The rules of :func:`violations` that hold for every container of a GPU pod,
    whatever it asks: no host PID or IPC namespace, no privileged container, none of
    :data:`DENIED_CAPABILITIES` added; with ``config``, the containers (init or not)
    named in ``gpu_containers`` also keep the env (reserved names, ``envFrom``
    prefixes) and volumeMount rules of GPU containers. For a pod that gets its GPU
    otherwise than by naming a resource (DRA mode: a pod naming hami's
    ResourceClaimTemplate itself; ``gpu_containers``: those using its claim). Never
    raises; [] = none."""
    problems = _host_problems(pod)
    iso = settings(config) if config is not None else None
    paths = plugin_paths(config.hook_path) if config is not None else ()
    for container in _containers(pod):
        cname = str(container.get("name", "?"))
        problems.extend(_security_problems(container, cname))
        if iso is not None and cname in gpu_containers:
            problems.extend(_env_problems(container, cname, iso, webhook_env=False))
            problems.extend(_mount_problems(container, cname, paths))
    return problems


def ephemeral_violations(container: Mapping[str, Any]) -> list[str]:
    """The rules for an ephemeral container added to a pod that asks for devices: not
    privileged, none of the denied capabilities (it could enter the GPU containers'
    mount namespace and undo the plugin's mounts). Never raises."""
    return _security_problems(container, f"(ephemeral) {container.get('name', '?')}")


def message(problems: Sequence[str]) -> str:
    """One denial message from :func:`violations` (the first five, then a count)."""
    text = "; ".join(problems[:5])
    return text + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")


# --- helpers -------------------------------------------------------------------------


def _resource_keys(container: Mapping[str, Any]) -> set[str]:
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return set()
    keys: set[str] = set()
    for section in ("limits", "requests"):
        values = resources.get(section)
        if isinstance(values, Mapping):
            keys.update(str(k) for k in values)
    return keys


def _containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return []
    out: list[Mapping[str, Any]] = []
    for key in ("initContainers", "containers"):
        items = spec.get(key)
        if isinstance(items, list):
            out.extend(c for c in items if isinstance(c, Mapping))
    return out


def _nvidia_request(container: Mapping[str, Any],
                    config: SchedulerConfig) -> ContainerDeviceRequest | None:
    """The registered NVIDIA backend's request of the container (None: none, or malformed,
    which is refused elsewhere with its own message)."""
    fast = config.fast_vendor()
    try:
        return fast.container_request(container) if fast is not None else None
    except ValueError:  # AdmissionError, QuantityError
        return None


def _list(container: Mapping[str, Any], key: str, cname: str,
          problems: list[str]) -> list[Mapping[str, Any]]:
    value = container.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        problems.append(f"container {cname}: {key} is not a list of objects")
        return []
    return value


def _host_problems(pod: Mapping[str, Any]) -> list[str]:
    spec = pod.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    return [f"spec.{key} is true: a pod that asks for GPUs may not share the host's {what} "
            "namespace" for key, what in (("hostPID", "PID"), ("hostIPC", "IPC"))
            if spec.get(key) is True]


def _security_problems(container: Mapping[str, Any], cname: str) -> list[str]:
    ctx = container.get("securityContext")
    if not isinstance(ctx, Mapping):
        return []
    problems = []
    if ctx.get("privileged"):
        problems.append(f"container {cname} is privileged")
    caps = ctx.get("capabilities")
    added = caps.get("add") if isinstance(caps, Mapping) else None
    for cap in added if isinstance(added, list) else []:
        bare = str(cap).upper().removeprefix("CAP_")
        if bare in DENIED_CAPABILITIES:
            problems.append(f"container {cname}: securityContext.capabilities.add {cap} is "
                            "not allowed in a pod that asks for GPUs (it can undo the device "
                            "plugin's mounts)")
    return problems


def _webhook_value(name: str, container: Mapping[str, Any], iso: EnvIsolation) -> str | None:
    """The value the webhook writes for ``name`` in this container, or None if none."""
    if name == names.ENV_TASK_PRIORITY:
        resources = container.get("resources")
        limits = resources.get("limits") if isinstance(resources, Mapping) else None
        raw = limits.get(iso.priority_resource) if isinstance(limits, Mapping) else None
        return None if raw is None else str(raw)
    policy = iso.core_policy
    return policy if policy and policy != "default" else None


def _env_problems(container: Mapping[str, Any], cname: str, iso: EnvIsolation,
                  webhook_env: bool = True) -> list[str]:
    """``webhook_env=False``: the names the webhook writes itself are not checked (a DRA
    pod's GPU resources, whose values they must carry, are gone after translation)."""
    problems: list[str] = []
    for entry in _list(container, "env", cname, problems):
        name = entry.get("name")
        if not isinstance(name, str):
            continue
        if name in WEBHOOK_ENV:
            if not webhook_env:
                continue
            expected = _webhook_value(name, container, iso)
            if expected is None or entry.get("value") != expected or "valueFrom" in entry:
                origin = ("the nvidia.com/priority limit" if name == names.ENV_TASK_PRIORITY
                          else "the gpuCorePolicy setting")
                problems.append(f"container {cname}: env {name} is reserved (hami sets it "
                                f"from {origin})")
        elif is_reserved_env(name):
            why = RESERVED_ENV.get(name, "the device plugin sets the per-GPU limits")
            problems.append(f"container {cname}: env {name} is reserved ({why})")
    for index, source in enumerate(_list(container, "envFrom", cname, problems)):
        kind = next((k for k in ("configMapRef", "secretRef") if k in source), "source")
        ref = source.get(kind)
        ref_name = ref.get("name", "?") if isinstance(ref, Mapping) else "?"
        prefix = source.get("prefix") or ""
        reached = prefix_reaches_reserved(str(prefix))
        if reached:
            what = "has no prefix" if not prefix else f"has prefix {prefix!r}"
            problems.append(f"container {cname}: envFrom[{index}] ({kind} {ref_name}) {what}, "
                            f"so its keys could set the reserved {reached}; give it a prefix "
                            "such as APP_ or list the keys under env")
    return problems


def _mount_problems(container: Mapping[str, Any], cname: str,
                    paths: Sequence[str]) -> list[str]:
    problems: list[str] = []
    for index, mount in enumerate(_list(container, "volumeMounts", cname, problems)):
        raw = mount.get("mountPath")
        if not isinstance(raw, str):
            continue
        path = normalise_path(raw)
        for reserved in paths:
            if path == reserved or path.startswith(reserved + "/"):
                problems.append(f"container {cname}: volumeMounts[{index}] mountPath {raw} "
                                f"lies on {reserved}, which the device plugin mounts")
                break
    return problems


def _ends_hidden(container: Mapping[str, Any]) -> bool:
    env = container.get("env")
    last = None
    for entry in env if isinstance(env, list) else []:
        if isinstance(entry, Mapping) and entry.get("name") == names.ENV_VISIBLE_DEVICES:
            last = entry
    return last is not None and last.get("value") == "none" and "valueFrom" not in last
