"""Vendors whose requests are a bare device count: Vastai and Biren (HAMi v2.10).

A request is always 100 % of each card's memory and 0 cores; devices come from a JSON
register annotation (HAMi v2.10); the allocation is written under
``hami.io/<CommonWord>-devices-to-allocate|allocated`` (HAMi v2.10). Memory or core resources
are not accepted (the vendors' guides: "you cannot specify the memory size").
"""

from __future__ import annotations

from collections.abc import Mapping

from hami.core.model import ContainerDeviceRequest
from hami.core.vendor import ResourceNames
from hami.devices.common import BaseVendor, Filters, int_resource


class CountOnlyVendor(BaseVendor):
    """A vendor with only a count resource."""

    def __init__(self, common_word: str, count_name: str, register: str, handshake: str,
                 filters: Filters) -> None:
        self.common_word = common_word
        self.count_name = count_name
        self.register_key = register
        self.handshake_key = handshake
        self.to_allocate_key = f"hami.io/{common_word}-devices-to-allocate"
        self.allocated_key = f"hami.io/{common_word}-devices-allocated"
        self.filters = filters

    def resource_names(self) -> ResourceNames:
        return ResourceNames(self.count_name)

    def container_request(self, container: Mapping[str, object]) -> ContainerDeviceRequest | None:
        nums = int_resource(container, self.count_name)
        if not nums:
            return None
        return ContainerDeviceRequest(nums, self.common_word, 0, 100, 0)
