"""Vastai (CommonWord ``Vastai``), (``hami.io/node-va-register``,
``hami.io/node-handshake-va``), (count-only; filters ``vastaitech.com/*``).

Not done: the ``die`` allocation strategy carried in device custom info (HAMi v2.10); the JSON
codec of the core does not return ``custominfo``, so dies are scheduled as cards.
"""

from __future__ import annotations

from hami.devices.common import Filters
from hami.devices.countonly import CountOnlyVendor

COMMON_WORD = "Vastai"
RESOURCE_COUNT = "vastaitech.com/va"
REGISTER = "hami.io/node-va-register"
HANDSHAKE = "hami.io/node-handshake-va"
# : Key names by analogy with the other vendors (HAMi v2.10 names only the ``vastaitech.com/``
# prefix).
FILTERS = Filters(use_type="vastaitech.com/use-gputype", nouse_type="vastaitech.com/nouse-gputype",
                  use_uuid="vastaitech.com/use-gpuuuid", nouse_uuid="vastaitech.com/nouse-gpuuuid")


def vastai(count_name: str = RESOURCE_COUNT) -> CountOnlyVendor:
    """The Vastai backend (``vastai.resourceCountName`` may rename the count)."""
    return CountOnlyVendor(COMMON_WORD, count_name, REGISTER, HANDSHAKE, FILTERS)
