"""Device-plugin settings: the ``nvidia:`` section of the device config plus the per-node
override ``/config/config.json`` (HAMi-core 1.2 and HAMi v2.10).

Pure: the loaders take already-read text; nothing here touches files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from hami.deviceplugin.mps import MpsConfigError, MpsSettings, parse_settings

MODE_HAMI_CORE = "hami-core"
MODES = ("hami-core", "mig", "mps")


class PluginConfigError(ValueError):
    """A device config or node config value is malformed."""


@dataclass(frozen=True, slots=True)
class MigAllowEntry:
    """One ``migProfileAllowlist`` entry (HAMi v2.10): GPUs whose model
    contains one of ``models`` may host the MIG ``profiles`` (``<N>g.<anything>``)."""

    models: tuple[str, ...]
    profiles: tuple[str, ...]


def parse_mig_allowlist(raw: Any) -> tuple[MigAllowEntry, ...]:
    """Validate ``migProfileAllowlist`` (HAMi v2.10): a list of ``{models, profiles}``, both
    non-empty lists of strings; each profile has a ``.`` and its part before the first
    ``.`` has at least 2 characters and ends with ``g``. ``None`` is ``()``.
    Raises :class:`PluginConfigError`."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise PluginConfigError("migProfileAllowlist must be a list of {models, profiles}")
    out = []
    for n, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise PluginConfigError(f"migProfileAllowlist[{n}] must be a mapping")
        lists = []
        for key in ("models", "profiles"):
            value = entry.get(key)
            if (not isinstance(value, list) or not value
                    or not all(isinstance(v, str) and v for v in value)):
                raise PluginConfigError(
                    f"migProfileAllowlist[{n}].{key} must be a non-empty list of strings")
            lists.append(tuple(value))
        for profile in lists[1]:
            head = profile.split(".", 1)[0]
            if "." not in profile or len(head) < 2 or not head.endswith("g"):
                raise PluginConfigError(
                    f"migProfileAllowlist[{n}]: profile {profile!r} is not <N>g.<name>")
        out.append(MigAllowEntry(lists[0], lists[1]))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class PluginConfig:
    """What the plugin needs to register devices and answer Allocate.

    ``device_memory_scaling`` multiplies the advertised MiB (> 1 = oversubscription);
    ``device_core_scaling`` x 100 is the advertised ``devcore``; ``device_split_count`` is
    both the registered ``count`` and the number of kubelet replicas per GPU.
    ``filter_uuids``/``filter_indices`` exclude GPUs from registration (HAMi v2.10).
    ``preconfigured_memory_mib`` is used when the backend cannot report memory.
    """

    resource_name: str = "nvidia.com/gpu"
    device_split_count: int = 10
    device_memory_scaling: float = 1.0
    device_core_scaling: float = 1.0
    disable_core_limit: bool = False
    libcuda_log_level: str = ""
    preconfigured_memory_mib: int = 0
    enable_numa_topology: bool = False
    operating_mode: str = MODE_HAMI_CORE
    filter_uuids: frozenset[str] = field(default_factory=frozenset)
    filter_indices: frozenset[int] = field(default_factory=frozenset)
    enable_get_preferred_allocation: bool = False
    mig_allowlist: tuple[MigAllowEntry, ...] = ()
    #: Our opt-in MPS plumbing (node config ``mps``; :mod:`hami.deviceplugin.mps`).
    mps: MpsSettings = field(default_factory=MpsSettings)

    @property
    def oversubscribed(self) -> bool:
        """True when ``CUDA_OVERSUBSCRIBE=true`` must be injected (scaling > 1, HAMi-core 1.2)."""
        return self.device_memory_scaling > 1


def _num(raw: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PluginConfigError(f"{key} must be a number, got {value!r}")
    if value < 0:
        raise PluginConfigError(f"{key} must not be negative, got {value!r}")
    return kind(value)


def _bool(raw: Mapping[str, Any], key: str, default: bool) -> bool:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise PluginConfigError(f"{key} must be true or false, got {value!r}")
    return value


def _str(raw: Mapping[str, Any], key: str, default: str) -> str:
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, bool):
        raise PluginConfigError(f"{key} must be a string, got {value!r}")
    return str(value)


def from_device_config(text: str | None) -> PluginConfig:
    """Parse HAMi's ``device-config.yaml`` text (``nvidia:`` section); None = chart defaults.

    Keys: ``resourceCountName``, ``deviceSplitCount``, ``deviceMemoryScaling``,
    ``deviceCoreScaling``, ``disableCoreLimit``, ``libCudaLogLevel``,
    ``preConfiguredDeviceMemory`` (MiB), ``enableNumaTopology``, ``migProfileAllowlist``
    (:func:`parse_mig_allowlist`). Raises
    :class:`PluginConfigError`.
    """
    if text is None:
        return PluginConfig()
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PluginConfigError(f"device config is not YAML: {exc}") from None
    if raw is None:
        return PluginConfig()
    if not isinstance(raw, dict):
        raise PluginConfigError("device config must be a mapping")
    nv = raw.get("nvidia") or {}
    if not isinstance(nv, dict):
        raise PluginConfigError("device config: 'nvidia' must be a mapping")
    base = PluginConfig()
    return PluginConfig(
        resource_name=_str(nv, "resourceCountName", base.resource_name),
        device_split_count=_num(nv, "deviceSplitCount", int, base.device_split_count),
        device_memory_scaling=_num(nv, "deviceMemoryScaling", float, base.device_memory_scaling),
        device_core_scaling=_num(nv, "deviceCoreScaling", float, base.device_core_scaling),
        disable_core_limit=_bool(nv, "disableCoreLimit", False),
        libcuda_log_level=_str(nv, "libCudaLogLevel", ""),
        preconfigured_memory_mib=_num(nv, "preConfiguredDeviceMemory", int, 0),
        enable_numa_topology=_bool(nv, "enableNumaTopology", False),
        mig_allowlist=parse_mig_allowlist(nv.get("migProfileAllowlist")),
    )


def apply_node_config(base: PluginConfig, text: str | None, node_name: str) -> PluginConfig:
    """Merge the entry of ``{"nodeconfig":[...]}`` whose ``name`` is ``node_name``.

    Non-zero / non-empty values win (HAMi's ``readFromConfigFile``); an absent file or an
    absent entry leaves ``base`` unchanged. ``operatingmode`` must be one of
    ``hami-core|mig|mps``. ``mps`` (ours, not HAMi's) is parsed by
    :func:`hami.deviceplugin.mps.parse_settings` and needs ``operatingmode: mps`` when
    enabled. Raises :class:`PluginConfigError`.
    """
    if not text:
        return base
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PluginConfigError(f"node config is not JSON: {exc}") from None
    entries = raw.get("nodeconfig") if isinstance(raw, dict) else None
    if entries is None:
        return base
    if not isinstance(entries, list):
        raise PluginConfigError("nodeconfig must be a list")
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("name") != node_name:
            continue
        changes: dict[str, Any] = {}
        mode = _str(entry, "operatingmode", "")
        if mode:
            if mode not in MODES:
                raise PluginConfigError(f"operatingmode must be one of {MODES}, got {mode!r}")
            changes["operating_mode"] = mode
        for key, attr, kind in (
            ("devicesplitcount", "device_split_count", int),
            ("devicememoryscaling", "device_memory_scaling", float),
            ("devicecorescaling", "device_core_scaling", float),
            ("preconfigureddevicememory", "preconfigured_memory_mib", int),
        ):
            value = _num(entry, key, kind, 0)
            if value:
                changes[attr] = value
        level = _str(entry, "libcudaloglevel", "")
        if level:
            changes["libcuda_log_level"] = level
        if _bool(entry, "enablenumatopology", False):
            changes["enable_numa_topology"] = True
        if _bool(entry, "enablegetpreferredallocation", False):
            changes["enable_get_preferred_allocation"] = True
        filt = entry.get("filterdevices") or {}
        if not isinstance(filt, dict):
            raise PluginConfigError("filterdevices must be an object")
        uuids = filt.get("uuid") or []
        indices = filt.get("index") or []
        if not isinstance(uuids, list) or not all(isinstance(u, str) for u in uuids):
            raise PluginConfigError("filterdevices.uuid must be a list of strings")
        if not isinstance(indices, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in indices
        ):
            raise PluginConfigError("filterdevices.index must be a list of integers")
        if uuids:
            changes["filter_uuids"] = frozenset(uuids)
        if indices:
            changes["filter_indices"] = frozenset(indices)
        if "mps" in entry:
            try:
                changes["mps"] = parse_settings(entry["mps"])
            except MpsConfigError as exc:
                raise PluginConfigError(str(exc)) from None
            if changes["mps"].enabled and changes.get("operating_mode",
                                                      base.operating_mode) != "mps":
                raise PluginConfigError("mps.enabled needs operatingmode \"mps\" on the "
                                        "same node")
        return replace(base, **changes)
    return base
