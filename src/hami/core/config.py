"""Settings of the NVIDIA backend and of scheduling, as one immutable object.

Source (HAMi v2.10): (``nvidia:`` section of the
device config), (scheduler flags). Loading YAML or flags happens in the
shells; the core only sees these values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from hami.api import names
from hami.core.vendor import Vendor


class ConfigError(ValueError):
    """A device config value has the wrong type or range."""


@dataclass(frozen=True, slots=True)
class NvidiaConfig:
    """The ``nvidia:`` section of HAMi's device config (chart defaults, HAMi v2.10).

    Resource names may be renamed by the operator (e.g. ``hami.io/gpu``); every request
    parser and the webhook read them from here. ``default_memory_mib`` 0 means "the
    whole card" for a container that gives neither memory nor percentage.
    """

    resource_count_name: str = names.RESOURCE_COUNT
    resource_memory_name: str = names.RESOURCE_MEMORY
    resource_memory_percentage_name: str = names.RESOURCE_MEMORY_PERCENTAGE
    resource_core_name: str = names.RESOURCE_CORES
    resource_priority_name: str = names.RESOURCE_PRIORITY
    default_memory_mib: int = 0
    default_cores_percent: int = 0
    default_gpu_num: int = 1
    memory_factor: int = 1
    overwrite_env: bool = False
    gpu_core_policy: str = ""
    runtime_class_name: str = ""
    device_split_count: int = 10
    device_memory_scaling: float = 1.0
    device_core_scaling: float = 1.0

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> NvidiaConfig:
        """Build from the YAML ``nvidia:`` mapping using HAMi's camelCase keys.

        Unknown keys are ignored (HAMi has more, e.g. ``migProfileAllowlist``).

        Raises:
            ConfigError: a known key holds a value of the wrong type or a negative number.
        """
        keymap = {
            "resourceCountName": "resource_count_name",
            "resourceMemoryName": "resource_memory_name",
            "resourceMemoryPercentageName": "resource_memory_percentage_name",
            "resourceCoreName": "resource_core_name",
            "resourcePriorityName": "resource_priority_name",
            "defaultMemory": "default_memory_mib",
            "defaultCores": "default_cores_percent",
            "defaultGPUNum": "default_gpu_num",
            "memoryFactor": "memory_factor",
            "overwriteEnv": "overwrite_env",
            "gpuCorePolicy": "gpu_core_policy",
            "runtimeClassName": "runtime_class_name",
            "deviceSplitCount": "device_split_count",
            "deviceMemoryScaling": "device_memory_scaling",
            "deviceCoreScaling": "device_core_scaling",
        }
        types = {f.name: f.type for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, attr in keymap.items():
            if key not in raw or raw[key] is None:
                continue
            values[attr] = _coerce(key, raw[key], str(types[attr]))
        return cls(**values)


def _coerce(key: str, value: Any, type_name: str) -> Any:
    if type_name == "str":
        if not isinstance(value, str):
            raise ConfigError(f"nvidia.{key} must be a string, got {value!r}")
        return value
    if type_name == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"nvidia.{key} must be true or false, got {value!r}")
        return value
    if type_name == "int":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"nvidia.{key} must be a non-negative integer, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"nvidia.{key} must be a positive number, got {value!r}")
    return float(value)


#: Node policies (HAMi v2.10) and GPU policies (HAMi v2.10) this build knows.
NODE_POLICIES = ("binpack", "spread", "fragmentation-aware")
GPU_POLICIES = ("spread", "binpack", "topology-aware", "mutex", "fragmentation-aware")
#: What a GPU policy may hold: one of these words or a comma list of them, e.g.
#: ``numa,binpack`` (HAMi v2.10: a chain, or bare ``numa``).
GPU_POLICY_WORDS = (*GPU_POLICIES, "numa")
#: Characters of an unknown policy value quoted in a message (the value is tenant input).
_SHOWN_CHARS = 64


def policy_value_known(key: str, value: object) -> bool:
    """Whether a pod's ``hami.io/node-scheduler-policy`` or ``hami.io/gpu-scheduler-policy``
    annotation (``key``) holds a value this build knows.

    A missing (None), empty or whitespace-only value means "not set" and counts as known.
    A node policy must be one of :data:`NODE_POLICIES`; a GPU policy a comma list whose
    every entry (trimmed, case-sensitive) is one of :data:`GPU_POLICY_WORDS`, so an empty
    entry (``binpack,``) is unknown. A value that is not a string is unknown. HAMi itself
    accepts anything and falls back silently (HAMi v2.10); we do not
    (``docs/decisions.md``). Any other ``key`` raises ``KeyError``.
    """
    if value is None:
        return True
    if not isinstance(value, str):
        return False
    if not value.strip():
        return True
    if key == names.NODE_SCHEDULER_POLICY:
        return value.strip() in NODE_POLICIES
    if key == names.GPU_SCHEDULER_POLICY:
        return all(part.strip() in GPU_POLICY_WORDS for part in value.split(","))
    raise KeyError(key)


def unknown_policy_message(key: str, value: object) -> str:
    """``unknown <key> value '<value>'; valid values: ...`` for a value that
    :func:`policy_value_known` refuses (the value quoted and cut to 64 characters)."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > _SHOWN_CHARS:
        text = text[:_SHOWN_CHARS] + "..."
    if key == names.GPU_SCHEDULER_POLICY:
        valid = f"{', '.join(GPU_POLICY_WORDS)}, or a comma list of them (e.g. numa,binpack)"
    else:
        valid = ", ".join(NODE_POLICIES)
    return f"unknown {key} value {text!r}; valid values: {valid}"


def unknown_policies(annotations: Mapping[str, object]) -> dict[str, str]:
    """The pod's scheduler-policy annotations whose value is unknown, as annotation key ->
    :func:`unknown_policy_message` (node policy first); empty when both are known or unset."""
    return {key: unknown_policy_message(key, annotations.get(key))
            for key in (names.NODE_SCHEDULER_POLICY, names.GPU_SCHEDULER_POLICY)
            if not policy_value_known(key, annotations.get(key))}


@dataclass(frozen=True, slots=True)
class SchedulingPolicy:
    """Cluster-wide scheduling defaults (flags ``--node-scheduler-policy`` binpack and
    ``--gpu-scheduler-policy`` spread, HAMi v2.10); pods may override both by annotation."""

    node_policy: str = "binpack"
    gpu_policy: str = "spread"


@dataclass(frozen=True, slots=True)
class EffectivePolicies:
    """The policies one pod is placed with, and a message per ignored annotation."""

    node_policy: str
    gpu_policy: str
    warnings: tuple[str, ...] = ()


def effective_policies(annotations: Mapping[str, object],
                       policy: SchedulingPolicy) -> EffectivePolicies:
    """The node and GPU policies after the pod's annotation overrides (HAMi v2.10).

    An empty annotation is "not set". An unknown value (one the webhook denies, so only a
    pod that bypassed it gets here) is ignored: the configured policy applies and a
    warning names the value, the valid ones and the policy used. HAMi instead falls back
    to ``spread`` (GPU) or ``binpack`` (node) whatever is configured (docs/decisions.md).
    """
    unknown = unknown_policies(annotations)
    warnings: list[str] = []

    def pick(key: str, configured: str, kind: str) -> str:
        if key in unknown:
            warnings.append(f"{unknown[key]}; the configured {kind} policy "
                            f"{configured!r} was used")
            return configured
        return str(annotations.get(key) or "").strip() or configured

    node_policy = pick(names.NODE_SCHEDULER_POLICY, policy.node_policy, "node")
    gpu_policy = pick(names.GPU_SCHEDULER_POLICY, policy.gpu_policy, "GPU")
    return EffectivePolicies(node_policy, gpu_policy, tuple(warnings))


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Everything the pure scheduler needs: the NVIDIA section, policy defaults, the
    webhook's scheduler-name settings (HAMi v2.10 step 3 and HAMi v2.10) and the vendor registry.

    ``hook_path`` is the device plugin's ``$HOOK_PATH`` (it mounts ``<hook_path>/vgpu``
    into GPU containers; :mod:`hami.core.isolation` keeps pods' volumes off it).
    ``other_gpu_schedulers`` are schedulerNames besides hami's whose pods may ask for GPUs;
    the webhook admits them unchanged (HAMi admits every other scheduler's pod).

    ``registry`` is HAMi's device map (CommonWord -> backend), built once by the shell
    (``hami.devices.registry.make_config`` / ``build_registry`` of the device config, HAMi
    v2.10). The core reaches every vendor's rules through it, NVIDIA's included (the
    request of ``PodRequest.containers`` and the webhook mutation are the ``NVIDIA``
    backend's); ``nvidia`` holds that backend's settings the core still reads itself
    (resource names for isolation and quota, ``overwriteEnv``, ``runtimeClassName``).
    An empty registry registers no vendor: no pod asks for devices.
    """

    nvidia: NvidiaConfig = field(default_factory=NvidiaConfig)
    policy: SchedulingPolicy = field(default_factory=SchedulingPolicy)
    scheduler_name: str = "hami-scheduler"
    force_overwrite_default_scheduler: bool = True
    hook_path: str = "/usr/local"
    other_gpu_schedulers: tuple[str, ...] = ()
    registry: Mapping[str, Vendor] = field(default_factory=dict, hash=False)

    def vendors(self) -> dict[str, Vendor]:
        """The registered vendors other than NVIDIA, by CommonWord (sorted)."""
        if not self.registry:
            return {}
        return {word: self.registry[word] for word in sorted(self.registry)
                if word != names.NVIDIA}
