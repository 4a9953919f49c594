"""The device registry (HAMi ``device.DevicesMap``), keyed by CommonWord, built from the
device config (HAMi v2.10 ``--enable-ascend`` / ``--enable-iluvatar``).

NVIDIA is always registered (from its ``nvidia:`` section, or the chart defaults without
one: hami schedules NVIDIA GPUs whatever else the config names). Any other vendor is
registered when its section is present in the config (an empty mapping is enough to take
the defaults); Ascend and Iluvatar additionally need their flag. Iteration is sorted by
CommonWord (HAMi's lock order, HAMi v2.10; Go map order is otherwise random).

:func:`make_config` is how the shells (and tests) build a
:class:`~hami.core.config.SchedulerConfig`: the core reaches every vendor, NVIDIA
included, only through the registry it is given.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import fields, replace
from typing import Any, TypeVar

from hami.api import names as api_names
from hami.core.config import ConfigError, SchedulerConfig
from hami.core.vendor import Vendor
from hami.devices.amd import Amd
from hami.devices.ascend import Ascend, AscendConfig
from hami.devices.awsneuron import AwsNeuron, NeuronConfig
from hami.devices.cambricon import Cambricon
from hami.devices.countonly import COUNT_ONLY
from hami.devices.enflame import EnflameConfig, EnflameShare
from hami.devices.kunlun import Kunlun, KunlunConfig, KunlunVxpu
from hami.devices.metax import MetaxConfig, MetaxSgpu
from hami.devices.mthreads import Mthreads
from hami.devices.nvidia import Nvidia, NvidiaConfig
from hami.devices.shares import (
    AMD,
    CAMBRICON,
    ENFLAME_GCU,
    HYGON,
    METAX_GPU,
    MTHREADS,
    ShareNames,
    ShareRow,
    ShareVendor,
    WholeCardVendor,
    iluvatar,
)

SECTIONS = ("nvidia", "metax", "hygon", "cambricon", "mthreads", "iluvatars", "enflame",
            "kunlun", "awsneuron", "amd", "vastai", "biren", "vnpus")

T = TypeVar("T")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


#: YAML keys that are not the camelCase of the field name.
_ALIASES = {"resourceNameGcu": "resourceNameGCU", "resourceNameVgcu": "resourceNameVGCU",
            "resourceNameVgcuPercentage": "resourceNameVGCUPercentage",
            "resourceVcountName": "resourceVCountName",
            "resourceVmemoryName": "resourceVMemoryName",
            "resourceVcoreName": "resourceVCoreName"}


def section(cls: type[T], raw: Mapping[str, Any] | None, base: T | None = None) -> T:
    """A config dataclass from its camelCase YAML mapping (unknown keys ignored); fields
    the mapping does not set keep ``base``'s values (the class defaults without one).

    Raises:
        ConfigError: a value has the wrong type.
    """
    values: dict[str, Any] = {}
    for fld in fields(cls):  # type: ignore[arg-type]
        key = _camel(fld.name)
        key = _ALIASES.get(key, key)
        if raw and key in raw and raw[key] is not None:
            value = raw[key]
            want = str(fld.type)
            ok = (isinstance(value, str) if want == "str" else
                  isinstance(value, bool) if want == "bool" else
                  isinstance(value, int) and not isinstance(value, bool))
            if not ok:
                raise ConfigError(f"{key} must be of type {want}, got {value!r}")
            values[fld.name] = value
    return replace(base, **values) if base is not None else cls(**values)  # type: ignore[type-var]


def _share_names(row: ShareRow, raw: Mapping[str, Any]) -> ShareNames:
    """A share vendor's section over its row's defaults (``memoryFactor`` only where the
    vendor has one).

    Raises:
        ConfigError: a value has the wrong type.
    """
    names = section(ShareNames, raw, row.defaults)
    return names if row.has_memory_factor else replace(names, memory_factor=1)


class Registry(Mapping[str, Vendor]):
    """Vendors by CommonWord, iterated in sorted order."""

    def __init__(self, vendors: Mapping[str, Vendor] | None = None) -> None:
        self._vendors = dict(sorted((vendors or {}).items()))

    def __getitem__(self, key: str) -> Vendor:
        return self._vendors[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._vendors)

    def __len__(self) -> int:
        return len(self._vendors)

    def add(self, vendor: Vendor) -> None:
        """Register (or replace) one vendor."""
        self._vendors[vendor.common_word] = vendor
        self._vendors = dict(sorted(self._vendors.items()))

    def resource_names(self) -> set[str]:
        """Every resource name any registered vendor manages (for ``managedResources``)."""
        return {n for v in self._vendors.values() for n in v.resource_names().all()}


def nvidia_registry(nvidia: NvidiaConfig | None = None) -> Registry:
    """A registry of NVIDIA alone (``nvidia`` settings, the chart defaults for None): what
    the scheduler serves without a device config."""
    return Registry({api_names.NVIDIA: Nvidia(nvidia or NvidiaConfig())})


def make_config(**fields: Any) -> SchedulerConfig:
    """``SchedulerConfig(**fields)`` whose registry always holds an NVIDIA backend.

    ``fields`` are :class:`~hami.core.config.SchedulerConfig`'s, plus ``nvidia`` (a
    :class:`~hami.devices.nvidia.NvidiaConfig`): the NVIDIA backend is built over it when
    given (replacing the one of ``fields["registry"]``); otherwise the registry's NVIDIA
    backend is kept; with neither, the chart defaults. The other vendors are those of
    ``fields["registry"]`` (none without one). Read NVIDIA's settings back with
    :func:`hami.devices.nvidia.settings`.
    """
    registry = Registry(fields.pop("registry", None) or {})
    nvidia = fields.pop("nvidia", None)
    backend = registry.get(api_names.NVIDIA)
    if nvidia is None:
        nvidia = backend.config if isinstance(backend, Nvidia) else NvidiaConfig()
    if not isinstance(backend, Nvidia) or backend.config != nvidia:
        registry.add(Nvidia(nvidia))
    return SchedulerConfig(registry=registry, **fields)


def build_registry(config: Mapping[str, Any], *, enable_ascend: bool = False,
                   enable_iluvatar: bool = False,
                   nvidia: NvidiaConfig | None = None) -> Registry:
    """The registry for a device config (the YAML as a mapping). NVIDIA is always in it,
    built over ``nvidia`` when given (the shell's settings after its flags), else over the
    config's ``nvidia:`` section (the defaults without one).

    Raises:
        ConfigError: every section is absent (``all configurations are empty``) or a value
            has the wrong type.
    """
    if not any(config.get(s) is not None for s in SECTIONS):
        raise ConfigError("all configurations are empty")
    reg = Registry()

    def present(key: str) -> Mapping[str, Any] | None:
        raw = config.get(key)
        if raw is None:
            return None
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{key} must be a mapping")
        return raw

    reg.add(Nvidia(nvidia if nvidia is not None
                   else NvidiaConfig.from_mapping(present("nvidia") or {})))
    if (raw := present("hygon")) is not None:
        reg.add(ShareVendor(HYGON, _share_names(HYGON, raw)))
    if (raw := present("cambricon")) is not None:
        reg.add(Cambricon(_share_names(CAMBRICON, raw)))
    if (raw := present("mthreads")) is not None:
        reg.add(Mthreads(_share_names(MTHREADS, raw)))
    if (raw := present("amd")) is not None:
        reg.add(Amd(_share_names(AMD, raw)))
    if (raw := present("awsneuron")) is not None:
        reg.add(AwsNeuron(section(NeuronConfig, raw)))
    if (raw := present("kunlun")) is not None:
        kcfg = section(KunlunConfig, raw)
        reg.add(Kunlun(kcfg))
        reg.add(KunlunVxpu(kcfg))
    if (raw := present("metax")) is not None:
        mcfg = section(MetaxConfig, raw)
        reg.add(WholeCardVendor(METAX_GPU, mcfg.resource_count_name))
        reg.add(MetaxSgpu(mcfg))
    if (raw := present("enflame")) is not None:
        ecfg = section(EnflameConfig, raw)
        reg.add(WholeCardVendor(ENFLAME_GCU, ecfg.resource_name_gcu))
        reg.add(EnflameShare(ecfg))
    for key, row in COUNT_ONLY.items():
        if (raw := present(key)) is not None:
            reg.add(row.vendor(str(raw.get("resourceCountName") or row.count_name)))
    if enable_iluvatar:
        for entry in config.get("iluvatars") or ():
            chip = str(entry.get("chipName") or entry.get("commonWord"))
            chip_row = iluvatar(chip, str(entry.get("commonWord") or chip))
            base = chip_row.defaults
            reg.add(ShareVendor(chip_row, ShareNames(
                str(entry.get("resourceCountName") or base.resource_count_name),
                str(entry.get("resourceMemoryName") or base.resource_memory_name),
                str(entry.get("resourceCoreName") or base.resource_core_name))))
    if enable_ascend:
        vnpus = config.get("vnpus") or {}
        entries = vnpus.get("configs", ()) if isinstance(vnpus, Mapping) else vnpus
        for entry in entries or ():
            try:
                reg.add(Ascend(AscendConfig.from_mapping(entry)))
            except (KeyError, TypeError, ValueError) as exc:
                raise ConfigError(f"vnpus entry {entry!r}: {exc}") from None
    return reg
