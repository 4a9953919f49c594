"""Biren (CommonWord ``Biren``), (``hami.io/node-biren-register``,
``hami.io/node-handshake-biren``), (count-only; filters ``birentech.com/*``).
Resource ``birentech.com/gpu`` (HAMi's Biren guide)."""

from __future__ import annotations

from hami.devices.common import Filters
from hami.devices.countonly import CountOnlyVendor

COMMON_WORD = "Biren"
RESOURCE_COUNT = "birentech.com/gpu"
REGISTER = "hami.io/node-biren-register"
HANDSHAKE = "hami.io/node-handshake-biren"
# : Key names by analogy with the other vendors (HAMi v2.10 names only the ``birentech.com/``
# prefix).
FILTERS = Filters(use_type="birentech.com/use-gputype", nouse_type="birentech.com/nouse-gputype",
                  use_uuid="birentech.com/use-gpuuuid", nouse_uuid="birentech.com/nouse-gpuuuid")


def biren(count_name: str = RESOURCE_COUNT) -> CountOnlyVendor:
    """The Biren backend (``biren.resourceCountName`` may rename the count)."""
    return CountOnlyVendor(COMMON_WORD, count_name, REGISTER, HANDSHAKE, FILTERS)
