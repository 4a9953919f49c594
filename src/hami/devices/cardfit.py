"""Steps shared by the vendors whose Fit is their own (AMD, Kunlunxin, AWS Neuron): the
per-card screen in HAMi's check order and the end of a Fit that picks a card set.

Reasons are HAMi's vocabulary (:mod:`hami.core.fit`, HAMi v2.10); a vendor without type or
UUID filters passes empty :class:`~hami.devices.common.Filters`, which accept every card.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence

from hami.core import fit as f
from hami.core.fit import DeviceState, FitOutcome, gen_reason
from hami.core.model import ContainerDevice, DeviceInfo
from hami.core.vendor import FitContext
from hami.devices.common import Filters


class CardScreen:
    """The checks of a card before its capacity: health, cordon, type and UUID filters.

    Built once per Fit (the pod's filter annotations and the node's cordon list parsed
    once); :meth:`reason` is then called per card.
    """

    def __init__(self, ctx: FitContext, filters: Filters) -> None:
        self.anns = ctx.pod_annotations
        self.filters = filters
        self.cordoned = ctx.cordoned
        self.use, self.nouse = filters.uuids(self.anns)

    def reason(self, info: DeviceInfo) -> str | None:
        """HAMi's reason the card is passed over, None when it may be used."""
        if not info.health:
            return f.CARD_NOT_HEALTH
        if info.uuid in self.cordoned:
            return f.CARD_CORDONED
        if not self.filters.type_ok(self.anns, info.type):
            return f.CARD_TYPE_MISMATCH
        if (self.use and info.uuid not in self.use) or info.uuid in self.nouse:
            return f.CARD_UUID_MISMATCH
        return None


def screened(devices: Sequence[DeviceState], ctx: FitContext, filters: Filters,
             counts: Counter[str]) -> Iterator[DeviceState]:
    """The devices that pass :class:`CardScreen`, in order; each card passed over is
    counted in ``counts`` under its reason as the iteration reaches it."""
    screen = CardScreen(ctx, filters)
    for dev in devices:
        reason = screen.reason(dev.info)
        if reason is None:
            yield dev
        else:
            counts[reason] += 1


def indices(grant: Sequence[Sequence[ContainerDevice]]) -> str:
    """The granted devices' indices, comma-joined in grant order (the device-index
    annotations of Kunlunxin, Moore Threads and AWS Neuron)."""
    return ",".join(str(d.index) for container in grant for d in container)


def finish_pick(counts: Counter[str], free: int, nums: int, total: int,
                grant: tuple[ContainerDevice, ...] | None, ctx: FitContext) -> FitOutcome:
    """The outcome of a Fit that chose ``grant`` (None: no valid set) among ``free`` usable
    cards of ``total`` for a request of ``nums``: the usable cards count as too few
    (``AllocatedCardsInsufficientRequest``) or as not matching the vendor's rule
    (``CardNotFoundCustomFilterRule``); a grant the quota refuses counts its cards as
    ``ResourceQuotaNotFit``."""
    if grant is None:
        if free:
            key = (f.ALLOCATED_CARDS_INSUFFICIENT_REQUEST if free < nums
                   else "CardNotFoundCustomFilterRule")
            counts[key] += free
        return FitOutcome(False, reason=gen_reason(counts, total))
    if ctx.quota_ok is not None and not ctx.quota_ok(grant):
        counts[f.RESOURCE_QUOTA_NOT_FIT] += len(grant)
        return FitOutcome(False, reason=gen_reason(counts, total))
    return FitOutcome(True, grant)


def too_few(devices: Sequence[object], nums: int) -> FitOutcome | None:
    """``NodeInsufficientDevice`` when the node has fewer cards than requested."""
    return FitOutcome(False, reason=f.NODE_INSUFFICIENT_DEVICE) if nums > len(devices) else None
