"""What the parts of :class:`~hami.scheduler.engine.Engine` share: the attributes its
constructor sets, declared for type checking (each part is a mixin of the engine)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Mapping
    from datetime import datetime

    from hami.core.config import SchedulerConfig
    from hami.core.state import ClusterState
    from hami.keyring import KeyRing
    from hami.scheduler.binder import NodeLocks
    from hami.scheduler.engine import Counters
    from hami.scheduler.events import EventSink
    from hami.scheduler.filterflow import DeferredAllocation
    from hami.scheduler.nodequeue import InFlight, NodeWaiters
    from hami.scheduler.podcache import PendingPods
    from hami.scheduler.ports import KubeApi, Observer
    from hami.scheduler.settings import SchedulerSettings

JSON = dict[str, Any]


class EngineParts:
    """Declarations only; :class:`~hami.scheduler.engine.Engine` sets them."""

    if TYPE_CHECKING:
        settings: SchedulerSettings
        config: SchedulerConfig
        kube: KubeApi
        state: ClusterState
        observer: Observer
        local_now: Callable[[], datetime]
        synced: asyncio.Event
        leader: bool
        binding_copies_labels: bool
        counters: Counters
        nodes: dict[str, JSON]
        node_reasons: dict[str, str]
        pending: PendingPods
        keyring: KeyRing | None
        events: EventSink
        locks: NodeLocks
        vendor_locks: dict[str, NodeLocks]
        waiters: NodeWaiters
        inflight: InFlight
        _reported: dict[str, int]
        _vendor_reported: dict[tuple[str, str], int]
        _registered: dict[str, tuple[dict[str, Any], frozenset[str] | None, str]]
        _committed_at: dict[str, float]
        _pending_patch: dict[str, asyncio.Future[str]]
        _phase_written: set[str]
        _deferred: dict[str, DeferredAllocation]
        _lock_keys: frozenset[str]
        _locked: set[tuple[str, str]]
        _background: set[asyncio.Task[Any]]

        def _all_locks(self) -> list[tuple[str, NodeLocks]]: ...
        async def _ready(self, timeout_s: float = 25.0) -> str: ...
        def _decide(self, pod: Mapping[str, Any], node_names: list[str] | None) -> Any: ...
        def lock_free(self, node: str) -> bool: ...
        def _spawn(self, coro: Any) -> None: ...
        def expire_reservations(self) -> None: ...
        def preemption_gate(self, uid: str) -> tuple[str | None, str]: ...
        async def confirm_victims(self, uid: str) -> bool: ...
        async def maybe_preempt(self, pod: Mapping[str, Any],
                                node_names: list[str] | None) -> str: ...
        def preemptor_bound(self, uid: str) -> None: ...
        def forget_unlisted_victims(self, listed: set[Any]) -> None: ...
