"""Loading settings from files (the shells' side of :mod:`hami.core.config`)."""

from __future__ import annotations

from pathlib import Path

import yaml

from hami.core.config import ConfigError, NvidiaConfig, SchedulerConfig, SchedulingPolicy


def load_device_config(path: Path | None) -> NvidiaConfig:
    """Read HAMi's device config YAML (``device-config.yaml``) and return its ``nvidia:``
    section; None gives the chart defaults.

    Raises:
        ConfigError: unreadable file, not a mapping, or a bad value.
    """
    if path is None:
        return NvidiaConfig()
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read device config {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"device config {path} must be a mapping with an 'nvidia' key")
    section = raw.get("nvidia") or {}
    if not isinstance(section, dict):
        raise ConfigError(f"device config {path}: 'nvidia' must be a mapping")
    return NvidiaConfig.from_mapping(section)


def scheduler_config(device_config: Path | None = None, node_policy: str = "binpack",
                     gpu_policy: str = "spread",
                     scheduler_name: str = "hami-scheduler") -> SchedulerConfig:
    """One settings object from the flags HAMi's scheduler takes (spec §7.4)."""
    return SchedulerConfig(nvidia=load_device_config(device_config),
                           policy=SchedulingPolicy(node_policy, gpu_policy),
                           scheduler_name=scheduler_name)
