"""The ledger DRA mode's webhook checks a namespace's GPU quota with: the core's
:class:`hami.core.quota.QuotaLedger` plus what it counted (the namespace's claims, its
pods and the pod-claim records, :mod:`hami.dra.podclaims`), so a check can tell what one
more claim adds. Pure."""

from __future__ import annotations

from typing import Any

from hami.core.quota import QuotaLedger
from hami.dra import podclaims
from hami.dra.podclaims import PodClaimRecord

JSON = dict[str, Any]


class NamespaceLedger(QuotaLedger):
    """A :class:`QuotaLedger` of one namespace's GPU quota in DRA mode, with what it
    counted (filled by :meth:`hami.dra.quotaview.QuotaView.namespace_ledger`) and
    :meth:`describe` adding ``notes`` (why some claims were booked more than they may
    hold)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.notes: list[str] = []
        #: the claims counted (listed, then reserved and not listed yet)
        self.held: list[podclaims.Held] = []
        #: how many of ``held`` are reservations of claims not stored yet
        self.pending = 0
        #: the :func:`hami.dra.reservations.claim_keys` of the listed claims
        self.listed_keys: set[str] = set()
        #: the namespace's pods (listed only when a record applies) and the records
        self.pods: list[JSON] = []
        self.records: list[PodClaimRecord] = []
        #: the claims booked under their pod (claim name -> pod name)
        self.grouped: dict[str, str] = {}

    def charge_of(self, *more: podclaims.Held) -> podclaims.NamespaceCharge:
        """:func:`hami.dra.podclaims.namespace_charge` of ``held`` plus ``more``."""
        return podclaims.namespace_charge([*self.held, *more], self.pods, self.records)

    def describe(self, namespace: str) -> str:
        """:meth:`QuotaLedger.describe`, then the notes."""
        return "; ".join([super().describe(namespace), *self.notes])
