"""Vendors whose behaviour is "shares of a card": one table, one generic backend.

A row (:class:`ShareRow`) declares a vendor: its CommonWord, annotation keys, user
filters, resource names and units, the admission limit on cores and where its devices
come from (a JSON or legacy CSV register annotation, or node capacity). Requests,
admission, node devices, the NVIDIA-like Fit and the pod annotations are then the
generic ones of :class:`ShareVendor` (HAMi v2.10: Hygon DCU, Iluvatar, Cambricon, ...);
a vendor module exists only for behaviour that is really its own (Cambricon's DSMLU
profile annotations, for example), as a subclass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hami.core.codec import decode_node_devices_json, decode_node_devices_legacy
from hami.core.model import ContainerDeviceRequest, DeviceInfo
from hami.core.request import INT32_MAX
from hami.core.vendor import ResourceNames
from hami.devices.common import (
    AdmissionError,
    BaseVendor,
    Filters,
    capacity,
    capacity_devices,
    in_limits,
    int_resource,
    memory_request,
    node_annotations,
    whole_request,
)


@dataclass(frozen=True, slots=True)
class ShareNames:
    """A vendor's section of the device config: resource names and ``memoryFactor``."""

    resource_count_name: str
    resource_memory_name: str
    resource_core_name: str
    memory_factor: int = 1


@dataclass(frozen=True, slots=True)
class ShareRow:
    """One vendor of the table.

    ``register`` is where its devices come from: ``"json"`` or ``"legacy"`` (the
    ``register_key`` node annotation) or ``"capacity"`` (``capacity(core name) //
    cores_per_device`` devices, the memory capacity split evenly, UUIDs
    ``<node>-<uuid_word>-<i>``). ``memory_unit_mib``: MiB per unit of the memory resource.
    ``max_cores``: the largest core value admission accepts. ``many_whole``: a request for
    more than one device is for whole cards (memory and cores apply to one shared card).
    ``has_memory_factor``: the section's ``memoryFactor`` is honoured (else always 1).
    ``devices_key``: the node annotation the devices are read from when it is not the
    register annotation (which the handshake loop also watches). ``min_cores``,
    ``default_cores``: the smallest core value and the value when the core resource is
    absent; ``cores_kind`` names them in the error (``"a percentage "``). ``checked_cores``: the core range is checked on every request, not only by the
    webhook. ``legal_memory_units``: the only memory values accepted (empty: any).
    ``bare_exclusive``: a request with neither memory nor cores is a whole card.
    ``split_mib``: capacity devices split the memory capacity in MiB, not in units.
    ``policy_neutral``: HAMi's policy-neutral ScoreNode marker. Whole cards (``many_whole``,
    ``bare_exclusive``) book ``cores_per_device`` cores.
    """

    common_word: str
    handshake_key: str
    allocated_key: str
    defaults: ShareNames
    to_allocate_key: str | None = None
    register: str = "json"
    register_key: str | None = None
    devices_key: str | None = None
    lock_annotation: str | None = None
    filters: Filters = Filters()
    memory_unit_mib: int = 1
    min_cores: int = 0
    max_cores: int = 100
    default_cores: int = 0
    cores_kind: str = ""
    checked_cores: bool = False
    legal_memory_units: tuple[int, ...] = ()
    many_whole: bool = False
    bare_exclusive: bool = False
    has_memory_factor: bool = False
    cores_per_device: int = 100
    split_mib: bool = False
    uuid_word: str = ""
    policy_neutral: bool = False


def declare(vendor: BaseVendor, row: ShareRow | WholeRow) -> None:
    """Give a row's backend the row's CommonWord, annotation keys and filters."""
    vendor.common_word = row.common_word
    vendor.handshake_key = row.handshake_key
    vendor.to_allocate_key = row.to_allocate_key
    vendor.allocated_key = row.allocated_key
    vendor.filters = row.filters


class ShareVendor(BaseVendor):
    """The generic backend of a :class:`ShareRow`."""

    def __init__(self, row: ShareRow, names: ShareNames | None = None) -> None:
        self.row = row
        self.config = names or row.defaults
        declare(self, row)
        self.register_key = row.register_key
        self.lock_annotation = row.lock_annotation
        self.policy_neutral = row.policy_neutral

    def resource_names(self) -> ResourceNames:
        c = self.config
        return ResourceNames(c.resource_count_name, c.resource_memory_name,
                             c.resource_core_name, max(c.memory_factor, 1),
                             memory_unit_mib=self.row.memory_unit_mib)

    def mutate_admission(self, container: dict[str, Any], pod: dict[str, Any]) -> bool:
        if not self.row.checked_cores:
            self.check_cores(container)
        self.container_request(container)
        return in_limits(container, self.config.resource_count_name)

    def check_cores(self, container: Mapping[str, Any]) -> int | None:
        """The container's core value (None when absent).

        Raises:
            AdmissionError: it is outside ``min_cores..max_cores``.
        """
        row, name = self.row, self.config.resource_core_name
        cores = int_resource(container, name)
        if cores is not None and not row.min_cores <= cores <= row.max_cores:
            raise AdmissionError(f"invalid {name} value {cores} in container "
                                 f"{container.get('name', '?')}: must be "
                                 f"{row.cores_kind}{row.min_cores}..{row.max_cores}")
        return cores

    def container_request(self, container: Mapping[str, Any]) -> ContainerDeviceRequest | None:
        c, row = self.config, self.row
        nums = int_resource(container, c.resource_count_name)
        if not nums:
            return None
        whole = ContainerDeviceRequest(nums, row.common_word, 0, 100, row.cores_per_device)
        if row.many_whole and nums > 1:
            return whole
        units = int_resource(container, c.resource_memory_name)
        scale = row.memory_unit_mib * max(c.memory_factor, 1)
        if units is not None and row.legal_memory_units and units not in row.legal_memory_units:
            raise AdmissionError(f"invalid {c.resource_memory_name} value {units} in container "
                                 f"{container.get('name', '?')}: must be one of "
                                 f"{', '.join(map(str, row.legal_memory_units))} (x{scale} MiB)")
        if (units or 0) > INT32_MAX // scale:
            raise AdmissionError(f"{c.resource_memory_name} of container "
                                 f"{container.get('name', '?')} is too large: {units} "
                                 f"(x{scale} MiB overflows int32)")
        cores = (self.check_cores(container) if row.checked_cores
                 else int_resource(container, c.resource_core_name))
        if row.bare_exclusive and units is None and cores is None:
            return whole
        cores = row.default_cores if cores is None else cores
        return memory_request(nums, row.common_word, (units or 0) * scale, cores)

    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        row = self.row
        if row.register == "capacity":
            count = capacity(node, self.config.resource_core_name) // row.cores_per_device
            if count == 0:
                return ()
            total = capacity(node, self.config.resource_memory_name)
            memory_mib = (total * row.memory_unit_mib // count if row.split_mib
                          else total // count * row.memory_unit_mib)
            return capacity_devices(node, count, row.common_word, row.common_word,
                                    memory_mib, row.cores_per_device,
                                    split=row.cores_per_device, uuid_word=row.uuid_word)
        raw = node_annotations(node).get(row.devices_key or row.register_key or "")
        if raw is None:
            return ()
        if row.register == "legacy":
            return decode_node_devices_legacy(raw, row.common_word)
        return decode_node_devices_json(raw, row.common_word)


#: Hygon DCU: legacy CSV register, ``memoryFactor`` (HAMi v2.10).
HYGON = ShareRow(
    "DCU", "hami.io/node-handshake-dcu", "hami.io/dcu-devices-allocated",
    ShareNames("hygon.com/dcunum", "hygon.com/dcumem", "hygon.com/dcucores"),
    to_allocate_key="hami.io/dcu-devices-to-allocate", register="legacy",
    register_key="hami.io/node-dcu-register", has_memory_factor=True,
    filters=Filters(use_type="hygon.com/use-dcutype", nouse_type="hygon.com/nouse-dcutype",
                    use_uuid="hygon.com/use-gpuuuid", nouse_uuid="hygon.com/nouse-gpuuuid"))

#: Cambricon MLU: devices from capacity (one per 100 vcore), 256 MiB units, own node lock;
#: more than one vmlu is whole cards (HAMi v2.10). Its profile annotations: cambricon.py.
CAMBRICON = ShareRow(
    "MLU", "hami.io/node-handshake-mlu", "hami.io/cambricon-mlu-devices-allocated",
    ShareNames("cambricon.com/vmlu", "cambricon.com/mlu.smlu.vmemory",
               "cambricon.com/mlu.smlu.vcore"),
    to_allocate_key="hami.io/cambricon-mlu-devices-to-allocate", register="capacity",
    lock_annotation="cambricon.com/dsmlu.lock", memory_unit_mib=256, many_whole=True,
    uuid_word="cambricon-mlu",
    filters=Filters(use_type="cambricon.com/use-mlutype",
                    nouse_type="cambricon.com/nouse-mlutype"))

#: AMD Instinct soft vGPU: core percentages 1..100 (100 when absent), which its own Fit
#: turns into compute units (amd.py) (HAMi v2.10).
AMD = ShareRow(
    "AMD", "hami.io/node-handshake-amd", "hami.io/amd-devices-allocated",
    ShareNames("amd.com/gpu", "amd.com/gpumem", "amd.com/gpucores"),
    to_allocate_key="hami.io/amd-devices-to-allocate", register_key="hami.io/node-amd-register",
    min_cores=1, default_cores=100, cores_kind="a percentage ", checked_cores=True,
    filters=Filters(use_type="amd.com/use-gputype", nouse_type="amd.com/nouse-gputype",
                    use_uuid="amd.com/use-gpu-uuid", nouse_uuid="amd.com/nouse-gpu-uuid"))

#: Moore Threads sGPU: 512 MiB units of a legal size, 16 core units a card, a count above
#: 1 or a bare count is whole cards, devices from capacity (HAMi v2.10; our choices in
#: docs/dev/vendors-design.md). Its webhook and pod annotations: mthreads.py.
MTHREADS = ShareRow(
    "Mthreads", "hami.io/node-handshake-mthreads", "hami.io/mthreads-vgpu-devices-allocated",
    ShareNames("mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core"),
    register="capacity", memory_unit_mib=512, legal_memory_units=(2, 4, 8, 16, 32, 64, 96),
    max_cores=16, checked_cores=True, many_whole=True, bare_exclusive=True,
    cores_per_device=16, split_mib=True, uuid_word="mthreads")

#: MetaX sGPU shares: GiB units, devices from ``metax-tech.com/node-gpu-devices`` read in
#: the JSON register form, policy-neutral ScoreNode (HAMi v2.10). QoS policy: metax.py.
METAX_SGPU = ShareRow(
    "Metax-SGPU", "hami.io/node-handshake-metax-sgpu", "hami.io/metax-sgpu-devices-allocated",
    ShareNames("metax-tech.com/sgpu", "metax-tech.com/vmemory", "metax-tech.com/vcore"),
    to_allocate_key="hami.io/metax-sgpu-devices-to-allocate",
    devices_key="metax-tech.com/node-gpu-devices", memory_unit_mib=1024, policy_neutral=True,
    filters=Filters(use_uuid="metax-tech.com/use-gpuuuid",
                    nouse_uuid="metax-tech.com/nouse-gpuuuid"))

#: Kunlunxin vXPU shares (JSON register; no core resource). Memory templates: kunlun.py.
KUNLUN_VXPU = ShareRow(
    "XPU", "hami.io/node-handshake-xpu", "hami.io/xpu-devices-allocated",
    ShareNames("kunlunxin.com/vxpu", "kunlunxin.com/vxpu-memory", ""),
    to_allocate_key="hami.io/xpu-devices-to-allocate", register_key="hami.io/node-register-xpu",
    filters=Filters(use_uuid="hami.io/use-xpu-uuid", nouse_uuid="hami.io/no-use-xpu-uuid"))


def iluvatar(chip: str, common_word: str | None = None) -> ShareRow:
    """The row of one Iluvatar chip family: ``hami.io/node-<CW>-register`` (legacy CSV),
    ``iluvatar.ai/<chip>-vgpu``, ``.vMem`` (256 MiB units), ``.vCore`` (HAMi v2.10)."""
    word = common_word or chip
    return ShareRow(
        word, f"hami.io/node-handshake-{word}", f"hami.io/{word}-devices-allocated",
        ShareNames(f"iluvatar.ai/{chip}-vgpu", f"iluvatar.ai/{chip}.vMem",
                   f"iluvatar.ai/{chip}.vCore"),
        to_allocate_key=f"hami.io/{word}-devices-to-allocate", register="legacy",
        register_key=f"hami.io/node-{word}-register", memory_unit_mib=256)


@dataclass(frozen=True, slots=True)
class WholeRow:
    """A vendor of whole cards counted in node capacity: ``count_name`` devices, UUIDs
    ``<node>-<uuid_word>-<i>``, ``split`` share slots each, every request all of a card's
    memory and cores (unless the vendor's module says otherwise)."""

    common_word: str
    handshake_key: str
    allocated_key: str
    to_allocate_key: str | None
    count_name: str
    uuid_word: str
    filters: Filters = Filters()
    split: int = 1


class WholeCardVendor(BaseVendor):
    """The generic backend of a :class:`WholeRow` (``count_name`` may rename the count)."""

    def __init__(self, row: WholeRow, count_name: str | None = None) -> None:
        self.row = row
        self.count_name = count_name or row.count_name
        declare(self, row)

    def resource_names(self) -> ResourceNames:
        return ResourceNames(self.count_name)

    def container_request(self, container: Mapping[str, Any]) -> ContainerDeviceRequest | None:
        nums = int_resource(container, self.count_name)
        return whole_request(nums, self.common_word) if nums else None

    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        word = self.common_word
        return capacity_devices(node, capacity(node, self.count_name), word, word, 0, 100,
                                split=self.row.split, uuid_word=self.row.uuid_word)


#: Whole Enflame GCUs (HAMi v2.10; the shared vGCU is enflame.py).
ENFLAME_GCU = WholeRow(
    "GCU", "hami.io/node-handshake-gcu", "hami.io/enflame-gcu-devices-allocated",
    "hami.io/enflame-gcu-devices-to-allocate", "enflame.com/gcu", "enflame",
    Filters(use_uuid="enflame.com/use-gpuuuid", nouse_uuid="enflame.com/nouse-gpuuuid"))

#: Whole MetaX GPUs (HAMi v2.10; the sGPU shares are metax.py).
METAX_GPU = WholeRow(
    "Metax-GPU", "hami.io/node-handshake-metax-gpu", "hami.io/metax-gpu-devices-allocated",
    "hami.io/metax-gpu-devices-to-allocate", "metax-tech.com/gpu", "metax-gpu")
