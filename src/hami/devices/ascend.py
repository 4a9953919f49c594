"""Huawei Ascend vNPU (one backend per ``vnpus.configs`` entry, ``--enable-ascend``).

Source (HAMi v2.10): (register ``hami.io/node-register-<CommonWord>`` JSON, handshake
``hami.io/node-handshake-<CommonWord>``, node annotation ``hami-vnpu-core``),
(``hami.io/<CommonWord>-devices-to-allocate|allocated``), (``vnpus``: ``configs[]``
keys): memory rounded up to the smallest template unless pod annotation
``huawei.com/vnpu-mode: hami-core``; multi-device requests use whole cards; the ``-core``
resource only in hami-core mode; 910C super-pod counts are 1 or even (1 becomes 2);
``ModeNotFit`` (HAMi v2.10); writes ``huawei.com/<CommonWord>`` runtime JSON and ``predicate-time``.
Template values below are HAMi's documented ``device-template`` examples.

Our choices (docs/dev/vendors-design.md): a hami-core pod fits only nodes whose ``hami-vnpu-core`` is
``true`` and a template pod only the others; a template share books
``aiCore(template) x 100 / aiCore(chip)`` percent of cores; the runtime JSON is a list of
``{"UUID": <card>, "temp": <template or "">}``; super-pod modules are the NPU pairs
``(2k, 2k+1)`` by device index. Not done: the network-topology-aware choice by
``NetworkID``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami.api import names
from hami.core.fit import DeviceState, FitOutcome, gen_reason
from hami.core.model import PERCENT_UNSET, ContainerDeviceRequest, PodSingleDevice
from hami.core.vendor import FitContext, PatchContext, ResourceNames
from hami.devices.common import (
    AdmissionError,
    BaseVendor,
    annotation,
    generic_fit,
    in_limits,
    int_resource,
)

VNPU_MODE = "huawei.com/vnpu-mode"
NODE_VNPU_CORE = "hami-vnpu-core"
PREDICATE_TIME = "predicate-time"
MODE_NOT_FIT = "ModeNotFit"


@dataclass(frozen=True, slots=True)
class Template:
    """A vNPU template: name, memory (MiB), AI cores, AI CPUs."""

    name: str
    memory_mib: int
    ai_core: int
    ai_cpu: int = 0


@dataclass(frozen=True, slots=True)
class AscendConfig:
    """One ``vnpus.configs[]`` entry (HAMi v2.10)."""

    chip_name: str
    common_word: str
    resource_name: str
    resource_memory_name: str
    resource_core_name: str = ""
    memory_allocatable: int = 0
    memory_capacity: int = 0
    memory_factor: int = 1
    ai_core: int = 0
    ai_cpu: int = 0
    super_pod: bool = False
    templates: tuple[Template, ...] = field(default_factory=tuple)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> AscendConfig:
        """From the camelCase YAML entry."""
        temps = tuple(Template(str(t["name"]), int(t.get("memory", 0)), int(t.get("aiCore", 0)),
                               int(t.get("aiCPU", 0))) for t in raw.get("templates") or ())
        word = str(raw["commonWord"])
        return cls(str(raw.get("chipName", word)), word,
                   str(raw.get("resourceName", f"huawei.com/{word}")),
                   str(raw.get("resourceMemoryName", f"huawei.com/{word}-memory")),
                   str(raw.get("resourceCoreName", "")),
                   int(raw.get("memoryAllocatable", 0)), int(raw.get("memoryCapacity", 0)),
                   int(raw.get("memoryFactor", 1) or 1), int(raw.get("aiCore", 0)),
                   int(raw.get("aiCPU", 0)), bool(raw.get("superPod", False)), temps)


#: HAMi's documented template examples (Project-HAMi docs, "Ascend device template").
ASCEND_910A = AscendConfig("910A", "Ascend910A", "huawei.com/Ascend910A",
                           "huawei.com/Ascend910A-memory", "", 32768, 32768, 1, 30, 0, False,
                           (Template("vir02", 2184, 2), Template("vir04", 4369, 4),
                            Template("vir08", 8738, 8), Template("vir16", 17476, 16)))
ASCEND_910B3 = AscendConfig("910B3", "Ascend910B3", "huawei.com/Ascend910B3",
                            "huawei.com/Ascend910B3-memory", "", 65536, 65536, 1, 20, 7, False,
                            (Template("vir05_1c_16g", 16384, 5, 1),
                             Template("vir10_3c_32g", 32768, 10, 3)))
ASCEND_310P = AscendConfig("310P3", "Ascend310P", "huawei.com/Ascend310P",
                           "huawei.com/Ascend310P-memory", "", 21527, 24576, 1, 8, 7, False,
                           (Template("vir01", 3072, 1, 1), Template("vir02", 6144, 2, 2),
                            Template("vir04", 12288, 4, 4)))


class Ascend(BaseVendor):
    """One Ascend chip family."""

    def __init__(self, config: AscendConfig) -> None:
        self.config = config
        word = config.common_word
        self.common_word = word
        self.register_key = f"hami.io/node-register-{word}"
        self.handshake_key = f"hami.io/node-handshake-{word}"
        self.to_allocate_key = f"hami.io/{word}-devices-to-allocate"
        self.allocated_key = f"hami.io/{word}-devices-allocated"
        self.runtime_key = f"huawei.com/{word}"

    def resource_names(self) -> ResourceNames:
        c = self.config
        return ResourceNames(c.resource_name, c.resource_memory_name, c.resource_core_name,
                             max(c.memory_factor, 1))

    def template_for(self, memory_mib: int) -> Template | None:
        """The smallest template with at least ``memory_mib``; None: a whole card."""
        for t in sorted(self.config.templates, key=lambda t: t.memory_mib):
            if t.memory_mib >= memory_mib:
                return t
        return None

    def mutate_admission(self, container: dict[str, Any], pod: dict[str, Any]) -> bool:
        hami_core = annotation(pod, VNPU_MODE) == names.MODE_HAMI_CORE
        core_name = self.config.resource_core_name
        if core_name and int_resource(container, core_name) is not None and not hami_core:
            raise AdmissionError(f"{core_name} in container {container.get('name', '?')} "
                                 f"needs pod annotation {VNPU_MODE}: {names.MODE_HAMI_CORE}")
        self._request(container, hami_core)
        return in_limits(container, self.config.resource_name)

    def container_request(self, container: Mapping[str, Any]) -> ContainerDeviceRequest | None:
        """Template mode (the pod annotation is applied by :meth:`request_for_pod`)."""
        return self._request(container, False)

    def request_for_pod(self, container: Mapping[str, Any],
                        pod_annotations: Mapping[str, str]) -> ContainerDeviceRequest | None:
        """The request with the pod's ``huawei.com/vnpu-mode`` taken into account."""
        return self._request(container, pod_annotations.get(VNPU_MODE) == names.MODE_HAMI_CORE)

    def _request(self, container: Mapping[str, Any], hami_core: bool
                 ) -> ContainerDeviceRequest | None:
        c = self.config
        nums = int_resource(container, c.resource_name)
        if not nums:
            return None
        if c.super_pod and nums != 1 and nums % 2:
            raise AdmissionError(f"{c.resource_name} of container {container.get('name', '?')} "
                                 f"must be 1 or even on a super pod, got {nums}")
        if c.super_pod and nums == 1:
            nums = 2
        whole = ContainerDeviceRequest(nums, c.common_word, 0, 100, 100)
        memory = (int_resource(container, c.resource_memory_name) or 0) * max(c.memory_factor, 1)
        if nums > 1 or memory == 0:
            return whole
        if hami_core:
            cores = int_resource(container, c.resource_core_name) or 0
            return ContainerDeviceRequest(1, c.common_word, memory, PERCENT_UNSET, min(cores, 100))
        template = self.template_for(memory)
        if template is None:
            return whole
        cores = template.ai_core * 100 // c.ai_core if c.ai_core else 0
        return ContainerDeviceRequest(1, c.common_word, template.memory_mib, PERCENT_UNSET, cores)

    def fit(self, devices: Sequence[DeviceState], request: ContainerDeviceRequest,
            ctx: FitContext) -> FitOutcome:
        pod_core = ctx.pod_annotations.get(VNPU_MODE) == names.MODE_HAMI_CORE
        node_core = ctx.node_annotations.get(NODE_VNPU_CORE) == "true"
        if pod_core != node_core:
            return FitOutcome(False, reason=gen_reason({MODE_NOT_FIT: len(devices)},
                                                       len(devices)))
        if self.config.super_pod:
            return self._fit_modules(devices, request, ctx)
        return generic_fit(devices, request, ctx, self.filters, self.common_word)

    def _fit_modules(self, devices: Sequence[DeviceState], request: ContainerDeviceRequest,
                     ctx: FitContext) -> FitOutcome:
        """Super pod: whole modules, the two NPUs ``2k`` and ``2k+1`` together, modules
        tried in the order their first NPU appears in the (best-first) device list."""
        everything = generic_fit(devices, request, ctx, self.filters, self.common_word)
        if not everything.ok:
            return everything  # HAMi's reasons over all cards
        modules: dict[int, list[DeviceState]] = {}
        for d in devices:
            modules.setdefault(d.info.index // 2, []).append(d)
        granted = []
        for pair in modules.values():
            if len(pair) != 2:
                continue
            two = ContainerDeviceRequest(2, request.type, request.memory_mib,
                                         request.memory_percent, request.cores_percent)
            out = generic_fit(pair, two, ctx, self.filters, self.common_word)
            if out.ok:
                granted.extend(sorted(out.devices, key=lambda c: c.index))
                if len(granted) == request.nums:
                    return FitOutcome(True, tuple(granted))
        return FitOutcome(False, reason=gen_reason({"CardNotFoundCustomFilterRule":
                                                    len(devices)}, len(devices)))

    def pod_annotations(self, grant: PodSingleDevice, ctx: PatchContext) -> dict[str, str]:
        out = super().pod_annotations(grant, ctx)
        if not out:
            return out
        hami_core = ctx.pod_annotations.get(VNPU_MODE) == names.MODE_HAMI_CORE
        runtime = []
        for container in grant:
            for d in container:
                t = None if hami_core else self._template_named(d.used_memory_mib)
                runtime.append({"UUID": d.uuid, "temp": t.name if t else ""})
        out[self.runtime_key] = json.dumps(runtime, separators=(",", ":"))
        out[PREDICATE_TIME] = str(ctx.now_ns)
        return out

    def _template_named(self, memory_mib: int) -> Template | None:
        return next((t for t in self.config.templates if t.memory_mib == memory_mib), None)
