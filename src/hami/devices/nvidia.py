"""NVIDIA as a :class:`~hami.core.vendor.Vendor`: an adapter over :mod:`hami.core`.

Source (HAMi v2.10): (resources), (keys and encodings), (webhook), (Fit).
Nothing is re-implemented here: requests, mutation, node decoding and Fit are the core's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hami.api import names
from hami.core.admission import mutate_container
from hami.core.codec import decode_node_devices
from hami.core.config import NvidiaConfig
from hami.core.fit import DeviceState, FitOutcome, NodeOptions, PodOptions, fit_container
from hami.core.model import ContainerDeviceRequest, DeviceInfo
from hami.core.quantity import QuantityError
from hami.core.request import RequestError, container_request
from hami.core.vendor import AdmissionError, FitContext, ResourceNames
from hami.devices.common import BaseVendor, node_annotations


class Nvidia(BaseVendor):
    """HAMi's NVIDIA backend (CommonWord ``NVIDIA``)."""

    common_word = names.NVIDIA
    handshake_key = names.NODE_HANDSHAKE
    register_key = names.NODE_REGISTER
    to_allocate_key = names.DEVICES_TO_ALLOCATE
    allocated_key = names.DEVICES_ALLOCATED

    def __init__(self, config: NvidiaConfig | None = None) -> None:
        self.config = config or NvidiaConfig()

    def resource_names(self) -> ResourceNames:
        c = self.config
        return ResourceNames(c.resource_count_name, c.resource_memory_name,
                             c.resource_core_name, max(c.memory_factor, 1),
                             others=(c.resource_memory_percentage_name,
                                     c.resource_priority_name))

    def mutate_admission(self, container: dict[str, Any], pod: dict[str, Any]) -> bool:
        try:
            return mutate_container(container, pod, self.config)
        except (RequestError, QuantityError) as exc:
            raise AdmissionError(str(exc)) from None

    def container_request(self, container: Mapping[str, Any]) -> ContainerDeviceRequest | None:
        try:
            return container_request(container, self.config)
        except (RequestError, QuantityError) as exc:
            raise AdmissionError(str(exc)) from None

    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        raw = node_annotations(node).get(names.NODE_REGISTER)
        return () if raw is None else decode_node_devices(raw, names.NVIDIA)

    def fit(self, devices: Sequence[DeviceState], request: ContainerDeviceRequest,
            ctx: FitContext) -> FitOutcome:
        pod = PodOptions.from_annotations(ctx.pod_annotations, ctx.gpu_policy)
        return fit_container(devices, request, pod,
                             NodeOptions.from_annotations(ctx.node_annotations), ctx.quota_ok)
