"""Settings of the NVIDIA backend and of scheduling, as one immutable object.

Source: ``shared/specs/hami-scheduler-spec.md`` §1.1-§1.2 (``nvidia:`` section of the
device config), §7.1 and §7.4 (scheduler flags). Loading YAML or flags happens in the
shells; the core only sees these values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from hami.api import names

if TYPE_CHECKING:  # the vendor backends import this module; only the type is needed here
    from hami.devices.protocol import Vendor


class ConfigError(ValueError):
    """A device config value has the wrong type or range."""


@dataclass(frozen=True, slots=True)
class NvidiaConfig:
    """The ``nvidia:`` section of HAMi's device config (chart defaults, spec §1.2).

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


#: Node policies (spec §4.8) and GPU policies (spec §4.7) this build knows.
NODE_POLICIES = ("binpack", "spread", "fragmentation-aware")
GPU_POLICIES = ("spread", "binpack", "topology-aware", "mutex", "fragmentation-aware")


@dataclass(frozen=True, slots=True)
class SchedulingPolicy:
    """Cluster-wide scheduling defaults (flags ``--node-scheduler-policy`` binpack and
    ``--gpu-scheduler-policy`` spread, spec §7.4); pods may override both by annotation."""

    node_policy: str = "binpack"
    gpu_policy: str = "spread"


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Everything the pure scheduler needs: the NVIDIA section, policy defaults, the
    webhook's scheduler-name settings (spec §3 step 3 and §7.4) and the vendor registry.

    ``registry`` is HAMi's device map (``hami.devices.registry.build_registry`` of the
    device config, spec §7.1, §9), built once by the shell. NVIDIA is always served by the
    core's own path from ``nvidia`` (request, webhook, Fit with MIG and topology, the
    vectorised prefilter); the registry's other vendors (``DCU``, ``MLU``, ``Ascend910B3``,
    ...) are dispatched through their backends. None or a registry with NVIDIA alone means
    an NVIDIA-only scheduler, exactly as before vendors were wired in.
    """

    nvidia: NvidiaConfig = field(default_factory=NvidiaConfig)
    policy: SchedulingPolicy = field(default_factory=SchedulingPolicy)
    scheduler_name: str = "hami-scheduler"
    force_overwrite_default_scheduler: bool = True
    registry: Mapping[str, Vendor] | None = field(default=None, hash=False)

    def vendors(self) -> dict[str, Vendor]:
        """The registered vendors other than NVIDIA, by CommonWord (sorted)."""
        if not self.registry:
            return {}
        return {word: self.registry[word] for word in sorted(self.registry)
                if word != names.NVIDIA}
