"""Loading settings from files (the shells' side of :mod:`hami.core.config`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import yaml

from hami.core.config import ConfigError, SchedulerConfig, SchedulingPolicy
from hami.devices.nvidia import NvidiaConfig
from hami.devices.registry import Registry, build_registry, nvidia_registry


def read_device_config(path: Path | None) -> dict[str, Any]:
    """HAMi's device config YAML (``device-config.yaml``, HAMi v2.10) as a mapping; ``{}``
    for None.

    Raises:
        ConfigError: unreadable file, not UTF-8 text, not YAML, or not a mapping.
    """
    if path is None:
        return {}
    try:
        raw = yaml.safe_load(path.read_text())
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read device config {path}: not UTF-8 text "
                          f"(byte {exc.start})") from None
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read device config {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"device config {path} must be a mapping with an 'nvidia' key")
    return raw


def _nvidia_section(raw: Mapping[str, Any], path: Path | None) -> NvidiaConfig:
    section = raw.get("nvidia") or {}
    if not isinstance(section, dict):
        raise ConfigError(f"device config {path}: 'nvidia' must be a mapping")
    return NvidiaConfig.from_mapping(section)


def load_device_config(path: Path | None) -> NvidiaConfig:
    """Read HAMi's device config YAML (``device-config.yaml``) and return its ``nvidia:``
    section; None gives the chart defaults.

    Raises:
        ConfigError: unreadable file, not a mapping, or a bad value.
    """
    return _nvidia_section(read_device_config(path), path)


def device_registry(raw: Mapping[str, Any], *, enable_ascend: bool = False,
                    enable_iluvatar: bool = False,
                    nvidia: NvidiaConfig | None = None) -> Registry:
    """The vendor registry of a device config (HAMi v2.10 ``--enable-ascend``,
    ``--enable-iluvatar``), NVIDIA always in it (over ``nvidia`` when given, else the
    config's section); NVIDIA alone when the config has no section at all (no file: the
    NVIDIA-only defaults).

    Raises:
        ConfigError: a section has a value of the wrong type.
    """
    if not raw:
        return nvidia_registry(nvidia or NvidiaConfig())
    try:
        return build_registry(raw, enable_ascend=enable_ascend, enable_iluvatar=enable_iluvatar,
                              nvidia=nvidia)
    except ConfigError as exc:
        if str(exc) == "all configurations are empty":
            return nvidia_registry(nvidia or NvidiaConfig())
        raise


def scheduler_config(device_config: Path | None = None, node_policy: str = "binpack",
                     gpu_policy: str = "spread",
                     scheduler_name: str = "hami-scheduler", *,
                     enable_ascend: bool = False,
                     enable_iluvatar: bool = False,
                     default_memory_mib: int | None = None,
                     default_cores_percent: int | None = None,
                     default_gpu_num: int | None = None) -> SchedulerConfig:
    """One settings object from the flags HAMi's scheduler takes (HAMi v2.10); the device
    config's vendor sections become the registry (built once, here). ``default_*``
    (HAMi's ``--default-mem``, ``--default-cores``, ``--default-gpu``) replace the device
    config's ``defaultMemory``, ``defaultCores``, ``defaultGPUNum`` when not None.

    Raises:
        ConfigError: unreadable device config, a bad value in it, or a negative default.
    """
    from dataclasses import replace

    raw = read_device_config(device_config)
    nvidia = _nvidia_section(raw, device_config)
    overrides = {k: v for k, v in (("default_memory_mib", default_memory_mib),
                                   ("default_cores_percent", default_cores_percent),
                                   ("default_gpu_num", default_gpu_num)) if v is not None}
    for key, value in overrides.items():
        if value < 0:
            flag = {"default_memory_mib": "--default-mem", "default_cores_percent":
                    "--default-cores", "default_gpu_num": "--default-gpu"}[key]
            raise ConfigError(f"{flag} must be 0 or more, got {value}")
    nvidia = replace(nvidia, **cast(dict[str, Any], overrides))
    return SchedulerConfig(policy=SchedulingPolicy(node_policy, gpu_policy),
                           scheduler_name=scheduler_name,
                           registry=device_registry(raw, enable_ascend=enable_ascend,
                                                    enable_iluvatar=enable_iluvatar,
                                                    nvidia=nvidia))
