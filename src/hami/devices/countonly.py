"""Vendors whose requests are a bare device count: Vastai and Biren (HAMi v2.10), rows of
:data:`COUNT_ONLY` served by :class:`CountOnlyVendor`.

A request is always 100 % of each card's memory and 0 cores; devices come from a JSON
register annotation (HAMi v2.10); the allocation is written under
``hami.io/<CommonWord>-devices-to-allocate|allocated`` (HAMi v2.10). Memory or core resources
are not accepted (the vendors' guides: "you cannot specify the memory size").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class CountOnlyRow:
    """One count-only vendor: CommonWord, the resource domain of its filter annotations
    (``<domain>/use|nouse-gputype``, ``<domain>/use|nouse-gpuuuid``; HAMi v2.10 names only
    the domain, the key names are by analogy with the other vendors), the short name of
    its register and handshake annotations and the default count resource."""

    common_word: str
    domain: str
    short: str
    count_name: str

    def vendor(self, count_name: str | None = None) -> CountOnlyVendor:
        """The backend (the section's ``resourceCountName`` may rename the count)."""
        d = self.domain
        filters = Filters(use_type=f"{d}/use-gputype", nouse_type=f"{d}/nouse-gputype",
                          use_uuid=f"{d}/use-gpuuuid", nouse_uuid=f"{d}/nouse-gpuuuid")
        return CountOnlyVendor(self.common_word, count_name or self.count_name,
                               f"hami.io/node-{self.short}-register",
                               f"hami.io/node-handshake-{self.short}", filters)


#: Device config section -> row. Vastai: the ``die`` allocation strategy carried in device
#: custom info (HAMi v2.10) is not done; the core's JSON codec does not return
#: ``custominfo``, so dies are scheduled as cards.
COUNT_ONLY = {
    "vastai": CountOnlyRow("Vastai", "vastaitech.com", "va", "vastaitech.com/va"),
    "biren": CountOnlyRow("Biren", "birentech.com", "biren", "birentech.com/gpu"),
}
