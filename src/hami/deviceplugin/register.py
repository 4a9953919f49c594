"""The node register annotation ``hami.io/node-nvidia-register`` and the kubelet device
list (HAMi-core 1.2 and HAMi v2.10). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from hami.core.codec import encode_node_devices
from hami.core.model import DeviceInfo, MigProfile
from hami.deviceplugin.config import PluginConfig
from hami.deviceplugin.discovery import PhysicalGpu

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


def device_type(name: str) -> str:
    """NVML name, prefixed ``NVIDIA-`` unless it already starts with ``NVIDIA``."""
    return name if name.startswith("NVIDIA") else f"NVIDIA-{name}"


def registered_memory_mib(gpu: PhysicalGpu, cfg: PluginConfig) -> int:
    """MiB to advertise: ``floor(bytes / 2^20)``, x ``deviceMemoryScaling`` (truncated)
    when the scaling is not 1 and the mode is not MIG; ``preConfiguredDeviceMemory`` when
    the memory is unknown (HAMi v2.10)."""
    mib = cfg.preconfigured_memory_mib if gpu.memory_bytes is None else gpu.memory_bytes // 2**20
    if cfg.device_memory_scaling != 1 and cfg.operating_mode != "mig":
        mib = int(mib * cfg.device_memory_scaling)
    return mib


def node_devices(gpus: Iterable[PhysicalGpu], cfg: PluginConfig,
                 unhealthy: frozenset[str] = frozenset(),
                 mig: Mapping[str, tuple[int, tuple[MigProfile, ...]]] | None = None,
                 ) -> tuple[DeviceInfo, ...]:
    """The registered devices, in index order, after ``filterdevices``.

    ``unhealthy`` holds UUIDs the health loop marked down (they stay registered with
    ``health`` false, so the scheduler stops placing on them). In ``mig`` mode ``mig``
    maps a GPU UUID to ``(count, migProfiles)`` (:func:`hami.deviceplugin.migplan.gpu_profiles`);
    GPUs without an entry are not registered (HAMi v2.10).
    """
    out = []
    for g in gpus:
        if g.uuid in cfg.filter_uuids or g.index in cfg.filter_indices:
            continue
        out.append(DeviceInfo(
            uuid=g.uuid,
            index=g.index,
            split_count=cfg.device_split_count,
            memory_mib=registered_memory_mib(g, cfg),
            cores_percent=100 if cfg.operating_mode == "mig" else int(cfg.device_core_scaling * 100),
            type=device_type(g.name),
            numa=g.numa,
            mode=cfg.operating_mode,
            health=g.healthy and g.uuid not in unhealthy,
        ))
        if cfg.operating_mode == "mig":
            count, profiles = (mig or {}).get(g.uuid, (0, ()))
            if not profiles:
                out.pop()
                continue
            out[-1] = replace(out[-1], split_count=count, mig_profiles=profiles)
    return tuple(out)


def encode_register(devices: Sequence[DeviceInfo]) -> str:
    """HAMi's JSON value of ``hami.io/node-nvidia-register`` (Go ``json.Marshal`` bytes,
    :func:`hami.core.codec.encode_node_devices`)."""
    return encode_node_devices(devices)


def annotations_to_write(wanted: Mapping[str, str | None], current: Mapping[str, str]
                         ) -> dict[str, str | None]:
    """The part of ``wanted`` (annotation key -> value) that the Node's ``current``
    annotations do not carry exactly: absent (the Node was deleted and re-created, or
    someone removed the key) or different (someone altered it); a wanted value None
    means the key must be absent (written as None: a merge patch removes it). Empty:
    nothing to write.

    Ours: HAMi compares with the value it sent last and so never repairs the Node until
    the plugin restarts."""
    return {key: value for key, value in wanted.items() if current.get(key) != value}


def replica_ids(gpu_uuid: str, split_count: int) -> list[str]:
    """The kubelet device IDs of one GPU: ``<UUID>-0 .. <UUID>-<count-1>`` (HAMi-core 1.2)."""
    return [f"{gpu_uuid}-{i}" for i in range(split_count)]


def kubelet_devices(devices: Sequence[DeviceInfo], numa_topology: bool
                    ) -> list[tuple[str, str, int | None]]:
    """``(id, health, numa or None)`` for ListAndWatch: every registered GPU's replicas,
    ``Healthy``/``Unhealthy`` from the GPU, NUMA only with ``enableNumaTopology``."""
    out: list[tuple[str, str, int | None]] = []
    for d in devices:
        health = HEALTHY if d.health else UNHEALTHY
        numa = d.numa if numa_topology else None
        out.extend((rid, health, numa) for rid in replica_ids(d.uuid, d.split_count))
    return out


def replica_map(devices: Sequence[DeviceInfo]) -> dict[str, str]:
    """Replica ID -> physical GPU UUID for every advertised replica."""
    return {rid: d.uuid for d in devices for rid in replica_ids(d.uuid, d.split_count)}
